//! The periodic role: declares the worker pool's periodic jobs, then sleeps until
//! the next slot of any of them and enqueues what came due. Every worker pool runs
//! it; the slot's unique key in the database, not this loop, makes each slot
//! run once (see `outbox/periodic.rs`).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::Shared;
use crate::db::run_blocking;
use crate::outbox::{PeriodicJob, declare_periodic_jobs, enqueue_due_slot};

/// The first wait after a failed declaration or enqueue; it doubles up to
/// [`MAX_RETRY`], so a database that is down is never asked in a hot loop.
const FIRST_RETRY: Duration = Duration::from_millis(500);
const MAX_RETRY: Duration = Duration::from_secs(30);

/// Where one job stands in this worker pool's loop.
struct Due {
    /// When to look at it next (`None`: at once).
    at: Option<DateTime<Utc>>,
    /// Failures in a row; each doubles the wait before the next try.
    failures: u32,
}

pub(super) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let jobs = shared.settings.periodic_jobs.clone();
    let mut failures = 0;
    loop {
        let declared = jobs.clone();
        let result = run_blocking(&shared.pool, move |conn| {
            Ok(declare_periodic_jobs(conn, &declared, Utc::now())?)
        })
        .await;
        match result {
            Ok(()) => break,
            Err(error) => {
                failures += 1;
                tracing::warn!(error = %error, "declaring the periodic jobs failed; will try again");
                if sleep_or_stop(retry_after(failures), &stop).await {
                    return;
                }
            }
        }
    }
    tracing::info!(
        jobs = ?jobs.iter().map(|j| format!("{} ({})", j.name(), j.schedule())).collect::<Vec<_>>(),
        "periodic jobs declared"
    );
    // At once at start: a slot that came while every worker pool was down runs now.
    let mut due: Vec<Due> = jobs
        .iter()
        .map(|_| Due {
            at: None,
            failures: 0,
        })
        .collect();
    loop {
        let now = Utc::now();
        for (job, due) in jobs.iter().zip(due.iter_mut()) {
            if due.at.is_some_and(|at| at > now) {
                continue;
            }
            due.at = match enqueue(&shared, job, now).await {
                Ok(()) => {
                    due.failures = 0;
                    job.schedule().next_slot(now)
                }
                Err(()) => {
                    due.failures += 1;
                    let wait =
                        chrono::Duration::from_std(retry_after(due.failures)).unwrap_or_default();
                    // A retry never skips a slot that comes meanwhile.
                    [Some(now + wait), job.schedule().next_slot(now)]
                        .into_iter()
                        .flatten()
                        .min()
                }
            };
        }
        let Some(next) = due.iter().filter_map(|d| d.at).min() else {
            // No job has a later slot (a cron expression's last year).
            stop.cancelled().await;
            return;
        };
        let wait = (next - Utc::now()).to_std().unwrap_or_default();
        if sleep_or_stop(wait, &stop).await {
            return;
        }
    }
}

/// Enqueues `job`'s slot due at `now`, if no worker pool has; `Err` after logging.
async fn enqueue(shared: &Arc<Shared>, job: &PeriodicJob, now: DateTime<Utc>) -> Result<(), ()> {
    let enqueuer = shared.settings.periodic_enqueuer.clone();
    let periodic = job.clone();
    let result = run_blocking(&shared.pool, move |conn| {
        Ok(enqueue_due_slot(conn, &enqueuer, &periodic, now)?)
    })
    .await;
    match result {
        Ok(Some(enqueued)) => {
            metrics::counter!("outbox_periodic_enqueued_total", "name" => job.name().to_owned())
                .increment(1);
            // DEBUG: a job every second would be a line a second at INFO;
            // the counter and `jobs schedules` tell the same.
            tracing::debug!(
                name = job.name(),
                slot = %enqueued.slot,
                job_id = enqueued.job_id,
                "enqueued a periodic job"
            );
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(error) => {
            tracing::warn!(
                name = job.name(),
                error = %error,
                "enqueueing a periodic job failed; will try again"
            );
            Err(())
        }
    }
}

fn retry_after(failures: u32) -> Duration {
    FIRST_RETRY
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(MAX_RETRY)
}

/// Sleeps `wait`; true when `stop` came first.
async fn sleep_or_stop(wait: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        () = stop.cancelled() => true,
        () = tokio::time::sleep(wait) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_to_a_cap() {
        assert_eq!(retry_after(1), FIRST_RETRY);
        assert_eq!(retry_after(2), FIRST_RETRY * 2);
        assert_eq!(retry_after(40), MAX_RETRY);
    }
}
