//! How `jobs prune` deletes done jobs (whole days as dropped partitions) and
//! shows its progress.

use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::{PruneArgs, count_of, with_conn};
use crate::outbox;

/// A duration as an operator would type it: `7d`, `12h`, `90m`, else humantime's form.
fn short_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if d.subsec_nanos() != 0 || secs == 0 {
        return humantime::format_duration(d).to_string();
    }
    for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60)] {
        if secs.is_multiple_of(size) {
            return format!("{}{unit}", secs / size);
        }
    }
    format!("{secs}s")
}

pub(super) async fn prune(args: PruneArgs) -> anyhow::Result<()> {
    let older_than = args.older_than;
    let age = short_duration(older_than);
    let total = with_conn(&args.db, move |conn| {
        outbox::count_prunable(conn, older_than).context("counting done jobs")
    })
    .await?;
    if args.dry_run {
        println!(
            "would delete {} that finished more than {age} ago (dry run: nothing was deleted)",
            count_of(total, "done job", "done jobs")
        );
        return Ok(());
    }
    let batch = i64::try_from(args.batch_size).unwrap_or(i64::MAX);
    let total = u64::try_from(total).unwrap_or(0);
    let mut progress = Progress::new(total, total > batch as u64);
    // Runs even when nothing is due: it also creates the coming days'
    // partitions and drops old empty ones.
    let report = with_conn(&args.db, move |conn| {
        let report =
            outbox::prune_done_jobs(conn, older_than, batch, |deleted| progress.update(deleted));
        progress.finish();
        report.context("pruning done jobs")
    })
    .await?;
    if report.deleted == 0 {
        println!("nothing to prune: no done jobs finished more than {age} ago");
    } else {
        // Whole days go as dropped partitions, strays as batched deletes;
        // the line names the ways that were used.
        let ways: Vec<String> = [
            (report.partitions_dropped > 0).then(|| {
                count_of(
                    report.partitions_dropped,
                    "dropped daily partition",
                    "dropped daily partitions",
                )
            }),
            (report.batches > 0).then(|| count_of(report.batches, "batch", "batches")),
        ]
        .into_iter()
        .flatten()
        .collect();
        println!(
            "deleted {} that finished more than {age} ago, in {}",
            count_of(report.deleted, "done job", "done jobs"),
            ways.join(" and ")
        );
    }
    // The attempt log ages with the jobs it describes.
    let attempts = with_conn(&args.db, move |conn| {
        crate::endpoints::attempts::prune(conn, older_than, batch)
            .context("pruning delivery_attempts")
    })
    .await?;
    if attempts > 0 {
        println!(
            "deleted {} that started more than {age} ago",
            count_of(attempts, "delivery attempt", "delivery attempts")
        );
    }
    let answers = with_conn(&args.db, move |conn| {
        crate::orders::prune_ledger(conn, older_than, batch).context("pruning effect_results")
    })
    .await?;
    if answers > 0 {
        println!(
            "deleted {} recorded more than {age} ago",
            count_of(answers, "effect ledger answer", "effect ledger answers")
        );
    }
    if report.partitions_busy > 0 {
        anyhow::bail!(
            "{} stayed locked by other sessions (readers of jobs_all) and {} kept; \
             run the prune again",
            count_of(
                report.partitions_busy,
                "daily partition due for dropping",
                "daily partitions due for dropping"
            ),
            if report.partitions_busy == 1 {
                "was"
            } else {
                "were"
            }
        );
    }
    Ok(())
}

/// Progress of a prune on stderr: a bar on a terminal, otherwise a line at
/// most every second (logs of a cron job should show it moving, not flood).
struct Progress {
    total: u64,
    bar: Option<indicatif::ProgressBar>,
    lines: bool,
    last_line: Option<Instant>,
}

impl Progress {
    fn new(total: u64, large: bool) -> Progress {
        let terminal = std::io::stderr().is_terminal();
        let bar = (large && terminal).then(|| {
            let bar = indicatif::ProgressBar::with_draw_target(
                Some(total),
                indicatif::ProgressDrawTarget::stderr(),
            );
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} done jobs deleted ({eta} left)",
            ) {
                bar.set_style(style);
            }
            bar
        });
        Progress {
            total,
            bar,
            lines: large && !terminal,
            last_line: None,
        }
    }

    fn update(&mut self, deleted: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(deleted.min(self.total));
        } else if self.lines
            && self
                .last_line
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            self.last_line = Some(Instant::now());
            eprintln!("deleted {deleted} of ~{} done jobs", self.total);
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_shown_as_an_operator_types_them() {
        assert_eq!(short_duration(Duration::from_secs(7 * 86_400)), "7d");
        assert_eq!(short_duration(Duration::from_secs(36 * 3_600)), "36h");
        assert_eq!(short_duration(Duration::from_secs(90 * 60)), "90m");
        assert_eq!(short_duration(Duration::from_secs(45)), "45s");
        assert_eq!(short_duration(Duration::from_millis(1500)), "1s 500ms");
    }
}
