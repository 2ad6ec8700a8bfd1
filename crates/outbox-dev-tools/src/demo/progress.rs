//! What the demo shows while the relay works: one live bar per job kind (done
//! out of placed, with pending, processing, waiting-to-retry and failed
//! counts), and above them a line for each event worth a person's attention:
//! a failed attempt and its retry, a success after retries, a job given up.
//!
//! Everything comes from `jobs_all` (the live jobs and the archive of done
//! ones), read a few times a second, so what is shown is the queue's real
//! state, not the demo's idea of it. When stdout is not a terminal the bars
//! are hidden and events print as plain lines.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use order_service::schema::jobs_all;
use order_service::text::one_line;

/// A job as the demo watches it.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = jobs_all)]
pub struct JobState {
    pub id: i64,
    pub order_id: Option<i64>,
    pub kind: String,
    pub status: String,
    pub attempts: i32,
    pub max_attempts: i32,
    pub run_after: DateTime<Utc>,
    pub last_error: Option<String>,
    pub payload: serde_json::Value,
}

impl JobState {
    pub fn is_finished(&self) -> bool {
        self.status == "done" || self.status == "failed"
    }

    /// The endpoint a delivery goes to.
    pub fn endpoint_id(&self) -> Option<i64> {
        self.payload
            .get("endpoint_id")
            .and_then(serde_json::Value::as_i64)
    }

    /// Pending after a failed attempt: waiting out its backoff.
    fn is_waiting_to_retry(&self) -> bool {
        self.status == "pending" && self.attempts > 0
    }
}

/// Every order's job, done ones included (`jobs_all`): the demo's database
/// holds only its own few dozen, so reading them all is cheap. The relay's
/// expiry sweeps, a job a second with no order, are not the orders' work.
pub fn load_jobs(conn: &mut PgConnection) -> QueryResult<Vec<JobState>> {
    jobs_all::table
        .filter(jobs_all::order_id.is_not_null())
        .order(jobs_all::id)
        .select(JobState::as_select())
        .load(conn)
}

/// Jobs of one kind, by what they are doing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KindCounts {
    pub pending: u64,
    pub retrying: u64,
    pub processing: u64,
    pub done: u64,
    pub failed: u64,
    /// Attempts made, all jobs of the kind together.
    pub attempts: u64,
}

impl KindCounts {
    pub fn of(jobs: &[JobState], kind: &str) -> KindCounts {
        let mut counts = KindCounts::default();
        for job in jobs.iter().filter(|j| j.kind == kind) {
            counts.attempts += u64::try_from(job.attempts).unwrap_or(0);
            match job.status.as_str() {
                "done" => counts.done += 1,
                "failed" => counts.failed += 1,
                "processing" => counts.processing += 1,
                _ if job.is_waiting_to_retry() => counts.retrying += 1,
                _ => counts.pending += 1,
            }
        }
        counts
    }

    pub fn total(&self) -> u64 {
        self.pending + self.retrying + self.processing + self.done + self.failed
    }
}

/// The bars and the event lines above them.
#[derive(Debug)]
pub struct LiveView {
    multi: MultiProgress,
    header: ProgressBar,
    kinds: Vec<(&'static str, ProgressBar)>,
}

impl LiveView {
    /// A bar for each of `kinds`, `orders` long to begin with (a kind with
    /// several jobs per order grows its bar as they appear).
    pub fn new(orders: u64, kinds: &[&'static str]) -> LiveView {
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stdout());
        let header = multi.add(ProgressBar::new_spinner());
        if let Ok(style) = ProgressStyle::with_template("{spinner} {elapsed:>3} {msg}") {
            header.set_style(style);
        }
        header.enable_steady_tick(Duration::from_millis(120));
        let style = ProgressStyle::with_template(
            "      {prefix:<18} [{bar:24.green/white}] {pos:>3}/{len:<3} done  {msg}",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        let kinds = kinds
            .iter()
            .map(|kind| {
                let bar = multi.add(ProgressBar::new(orders));
                bar.set_style(style.clone());
                bar.set_prefix(*kind);
                (*kind, bar)
            })
            .collect();
        LiveView {
            multi,
            header,
            kinds,
        }
    }

    /// Prints `text` above the bars (or as a plain line without a terminal).
    pub fn line(&self, text: impl AsRef<str>) {
        if self.multi.is_hidden() || self.multi.println(text.as_ref()).is_err() {
            println!("{}", text.as_ref());
        }
    }

    pub fn status(&self, text: impl Into<std::borrow::Cow<'static, str>>) {
        self.header.set_message(text);
    }

    pub fn show(&self, jobs: &[JobState]) {
        for (kind, bar) in &self.kinds {
            let c = KindCounts::of(jobs, kind);
            bar.set_length(c.total().max(bar.length().unwrap_or(0)));
            bar.set_position(c.done);
            let mut parts = Vec::new();
            for (n, what) in [
                (c.pending, "pending"),
                (c.processing, "processing"),
                (c.retrying, "waiting to retry"),
                (c.failed, "failed"),
            ] {
                if n > 0 {
                    parts.push(format!("{n} {what}"));
                }
            }
            bar.set_message(parts.join(" · "));
        }
    }

    /// Removes the bars; what follows is printed below the event lines.
    pub fn clear(&self) {
        for (_, bar) in &self.kinds {
            bar.finish_and_clear();
        }
        self.header.finish_and_clear();
        let _ = self.multi.clear();
    }
}

/// Turns successive snapshots of the jobs into event lines.
#[derive(Debug, Default)]
pub struct Narrator {
    /// Last seen (status, attempts) of each job.
    seen: HashMap<i64, (String, i32)>,
    /// Endpoint names by id, to say where a delivery went.
    endpoints: HashMap<i64, String>,
}

impl Narrator {
    pub fn with_endpoints(endpoints: HashMap<i64, String>) -> Narrator {
        Narrator {
            endpoints,
            ..Narrator::default()
        }
    }

    /// `order_webhook`, or `order_webhook → analytics` for a delivery.
    fn what(&self, job: &JobState) -> String {
        match job.endpoint_id().and_then(|id| self.endpoints.get(&id)) {
            Some(name) => format!("{} → {name}", job.kind),
            None => job.kind.clone(),
        }
    }

    pub fn observe(&mut self, jobs: &[JobState], now: DateTime<Utc>) -> Vec<String> {
        let mut lines = Vec::new();
        for job in jobs {
            let previous = self.seen.get(&job.id);
            let changed = previous.is_none_or(|(status, attempts)| {
                *status != job.status || *attempts != job.attempts
            });
            if !changed {
                continue;
            }
            let order = job
                .order_id
                .map_or_else(|| format!("job {}", job.id), |id| format!("order #{id}"));
            let error = job
                .last_error
                .as_deref()
                .map(|e| one_line(e, 140))
                .unwrap_or_default();
            if job.is_waiting_to_retry() && !error.is_empty() {
                let wait = (job.run_after - now).to_std().unwrap_or_default();
                // The relay's own "attempt n of m failed, will retry: " is said below.
                let cause = error
                    .split_once(", will retry: ")
                    .map_or(error.as_str(), |(_, cause)| cause);
                lines.push(format!(
                    "  ↻ {order} {}: attempt {} of {} failed: {cause}; retrying in {:.1}s",
                    self.what(job),
                    job.attempts,
                    job.max_attempts,
                    wait.as_secs_f64()
                ));
            } else if job.status == "done" && job.attempts > 1 {
                lines.push(format!(
                    "  ✓ {order} {}: succeeded on attempt {}",
                    self.what(job),
                    job.attempts
                ));
            } else if job.status == "failed" {
                lines.push(format!(
                    "  ✗ {order} {}: failed after {} attempt(s): {error}",
                    self.what(job),
                    job.attempts
                ));
            }
            self.seen.insert(job.id, (job.status.clone(), job.attempts));
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: i64, status: &str, attempts: i32, error: Option<&str>) -> JobState {
        JobState {
            id,
            order_id: Some(1),
            kind: "order_webhook".into(),
            status: status.into(),
            attempts,
            max_attempts: 8,
            run_after: Utc::now() + chrono::Duration::milliseconds(400),
            last_error: error.map(str::to_owned),
            payload: serde_json::json!({"order_id": 1, "endpoint_id": 7}),
        }
    }

    #[test]
    fn a_retry_and_the_success_after_it_are_each_told_once_naming_the_endpoint() {
        let mut narrator = Narrator::with_endpoints(HashMap::from([(7, "analytics".to_owned())]));
        let now = Utc::now();
        assert!(
            narrator
                .observe(&[job(3, "pending", 0, None)], now)
                .is_empty()
        );
        let error = "attempt 1 of 8 failed, will retry: HTTP 500";
        let retry = narrator.observe(&[job(3, "pending", 1, Some(error))], now);
        assert_eq!(retry.len(), 1, "{retry:?}");
        assert!(
            retry[0].starts_with(
                "  ↻ order #1 order_webhook → analytics: attempt 1 of 8 failed: HTTP 500; retrying in 0."
            ),
            "{retry:?}"
        );
        assert!(
            narrator
                .observe(&[job(3, "pending", 1, Some(error))], now)
                .is_empty()
        );
        let done = narrator.observe(&[job(3, "done", 3, None)], now);
        assert_eq!(
            done,
            vec!["  ✓ order #1 order_webhook → analytics: succeeded on attempt 3"]
        );
    }

    #[test]
    fn counts_tell_waiting_to_retry_from_never_tried() {
        let jobs = [
            job(1, "pending", 0, None),
            job(2, "pending", 2, Some("HTTP 500")),
            job(3, "done", 1, None),
            job(4, "failed", 8, Some("HTTP 500")),
        ];
        let c = KindCounts::of(&jobs, "order_webhook");
        assert_eq!((c.pending, c.retrying, c.done, c.failed), (1, 1, 1, 1));
        assert_eq!(c.attempts, 11);
        assert_eq!(c.total(), 4);
    }
}
