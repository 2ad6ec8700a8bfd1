//! The queue's depth over an open-loop run: pending and processing jobs,
//! sampled on a connection of their own, and whether the depth stayed
//! bounded.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use diesel::prelude::*;

/// How often the depth is read.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// A relay that drains at least this share of what arrives is taken as
/// keeping up: a smaller deficit does not show above the noise of a run
/// of seconds, and the growth is reported whatever the verdict.
const KEEPING_UP: f64 = 0.98;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DepthSample {
    /// Seconds since the run's schedule started.
    pub at: f64,
    pub pending: i64,
    pub processing: i64,
}

impl DepthSample {
    fn depth(&self) -> f64 {
        (self.pending + self.processing) as f64
    }
}

/// The depth series read as one verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct DepthSummary {
    pub samples: usize,
    pub max: i64,
    pub first_third_mean: f64,
    pub last_third_mean: f64,
    /// Jobs per second the depth grew by, from the first third's mean to
    /// the last's (negative: it shrank).
    pub growth_per_second: f64,
    /// The growth is under 2% of the jobs' arrival rate (see [`KEEPING_UP`]).
    pub bounded: bool,
}

/// Reads `samples` against `jobs_per_second` arriving. `None` with fewer
/// than three samples: no thirds to compare.
pub fn summarize(samples: &[DepthSample], jobs_per_second: f64) -> Option<DepthSummary> {
    let third = samples.len() / 3;
    if third == 0 {
        return None;
    }
    let mean = |part: &[DepthSample]| {
        let n = part.len() as f64;
        (
            part.iter().map(DepthSample::depth).sum::<f64>() / n,
            part.iter().map(|s| s.at).sum::<f64>() / n,
        )
    };
    let (first, first_at) = mean(&samples[..third]);
    let (last, last_at) = mean(&samples[samples.len() - third..]);
    let span = last_at - first_at;
    let growth = if span > 0.0 {
        (last - first) / span
    } else {
        0.0
    };
    Some(DepthSummary {
        samples: samples.len(),
        max: samples
            .iter()
            .map(|s| s.pending + s.processing)
            .max()
            .unwrap_or(0),
        first_third_mean: first,
        last_third_mean: last,
        growth_per_second: growth,
        bounded: growth <= (1.0 - KEEPING_UP) * jobs_per_second.max(0.0),
    })
}

/// Samples the depth every [`SAMPLE_EVERY`] on its own connection, on a
/// blocking thread, until [`DepthProbe::finish`].
pub struct DepthProbe {
    stop: Arc<AtomicBool>,
    thread: tokio::task::JoinHandle<anyhow::Result<Vec<DepthSample>>>,
}

impl DepthProbe {
    pub fn start(url: &str, started: Instant) -> DepthProbe {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = tokio::task::spawn_blocking({
            let (stop, url) = (Arc::clone(&stop), url.to_owned());
            move || -> anyhow::Result<Vec<DepthSample>> {
                let mut conn = PgConnection::establish(&url)?;
                let mut samples = Vec::new();
                let mut next = started;
                while !stop.load(Ordering::Relaxed) {
                    samples.push(read_depth(&mut conn, started)?);
                    // On the schedule, not SAMPLE_EVERY after each read: a
                    // slow read on a busy server shifts no later sample.
                    next += SAMPLE_EVERY;
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                }
                Ok(samples)
            }
        });
        DepthProbe { stop, thread }
    }

    pub async fn finish(self) -> anyhow::Result<Vec<DepthSample>> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.await?
    }
}

/// Pending and processing jobs now. Both are unfinished, the claim index's
/// own predicate, so the count walks that index's live entries only.
fn read_depth(conn: &mut PgConnection, started: Instant) -> anyhow::Result<DepthSample> {
    use diesel::sql_types::BigInt;
    #[derive(QueryableByName)]
    struct Depth {
        #[diesel(sql_type = BigInt)]
        pending: i64,
        #[diesel(sql_type = BigInt)]
        processing: i64,
    }
    let depth: Depth = diesel::sql_query(
        "SELECT count(*) FILTER (WHERE status = 'pending') AS pending, \
                count(*) FILTER (WHERE status = 'processing') AS processing \
         FROM jobs WHERE finished_at IS NULL",
    )
    .get_result(conn)?;
    Ok(DepthSample {
        at: started.elapsed().as_secs_f64(),
        pending: depth.pending,
        processing: depth.processing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(depths: &[i64]) -> Vec<DepthSample> {
        depths
            .iter()
            .enumerate()
            .map(|(i, &d)| DepthSample {
                at: i as f64 * 0.25,
                pending: d,
                processing: 0,
            })
            .collect()
    }

    #[test]
    fn a_depth_that_hovers_is_bounded() {
        let summary = summarize(&series(&[3, 9, 2, 7, 4, 8, 1, 6, 5]), 1500.0).expect("thirds");
        assert!(summary.bounded, "{summary:?}");
        assert_eq!(summary.max, 9);
        assert_eq!(summary.samples, 9);
    }

    #[test]
    fn a_depth_that_climbs_with_the_deficit_is_not_bounded() {
        // 1,500 jobs/s arrive, 1,000 leave: 125 more every 250 ms.
        let depths: Vec<i64> = (0..12).map(|i| i * 125).collect();
        let summary = summarize(&series(&depths), 1500.0).expect("thirds");
        assert!(!summary.bounded, "{summary:?}");
        assert!(
            (summary.growth_per_second - 500.0).abs() < 1.0,
            "{summary:?}"
        );
        assert_eq!(summary.max, 1375);
    }

    #[test]
    fn a_draining_backlog_is_bounded() {
        let summary = summarize(&series(&[900, 600, 300, 100, 20, 5]), 100.0).expect("thirds");
        assert!(summary.bounded && summary.growth_per_second < 0.0);
    }

    #[test]
    fn too_few_samples_give_no_verdict() {
        assert_eq!(summarize(&series(&[1, 2]), 100.0), None);
    }
}
