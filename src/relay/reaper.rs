//! The reaper: jobs whose lease expired go back to `pending`, or to `failed`.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{REAP_BATCH, RelayStats, Shared};
use crate::db::run_blocking;
use crate::outbox::{Spare, reap_expired_leases_sparing};

/// Reaps at every `reap_interval` (and once at start), until `stop`. Safe on
/// every relay at once: the reap query skips rows another reaper holds.
pub(super) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let mut ticks = tokio::time::interval(shared.settings.reap_interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        // A full batch means there may be more: go again at once.
        loop {
            let policy = shared.settings.backoff;
            // This relay's own effects still running: their leases lapse only
            // when the heartbeat lost the database, and the next one renews them.
            let live: Vec<i64> = shared.leases().iter().map(|l| l.job_id).collect();
            let worker = shared.settings.worker_id.clone();
            let result = run_blocking(&shared.pool, move |conn| {
                let spare = Spare {
                    worker_id: &worker,
                    job_ids: &live,
                };
                Ok(reap_expired_leases_sparing(
                    conn,
                    REAP_BATCH,
                    &spare,
                    |attempt| policy.jittered_delay(attempt),
                )?)
            })
            .await;
            match result {
                Ok(report) if report.total() > 0 => {
                    RelayStats::add(&shared.stats.reaped, report.total() as u64);
                    metrics::counter!("outbox_jobs_reaped_total", "outcome" => "requeued")
                        .increment(report.requeued as u64);
                    metrics::counter!("outbox_jobs_reaped_total", "outcome" => "failed")
                        .increment(report.failed as u64);
                    tracing::warn!(
                        requeued = report.requeued,
                        failed = report.failed,
                        "reaped expired leases"
                    );
                    if report.total() < REAP_BATCH as usize {
                        break;
                    }
                    // Reaped jobs are due again: wake this relay's producer.
                    shared.wake.notify_one();
                }
                Ok(_) => break,
                Err(error) => {
                    tracing::warn!(error = %error, "reaping expired leases failed; will try again");
                    break;
                }
            }
        }
    }
}
