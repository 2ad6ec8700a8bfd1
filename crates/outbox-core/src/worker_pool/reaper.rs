//! The reaper: jobs whose lease expired go back to `pending`, or to `failed`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::{PoolStats, REAP_BATCH, Shared};
use crate::db::run_blocking;
use crate::outbox::archive::PARTITION_UPKEEP_EVERY;
use crate::statements::{ReapRequest, ensure_done_partitions};

/// Reaps at every `reap_interval` (and once at start), until `stop`. Safe on
/// every worker pool at once: the reap query skips rows another reaper holds.
pub(super) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let mut ticks = tokio::time::interval(shared.settings.reap_interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut upkept: Option<Instant> = None;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        if upkept.is_none_or(|at| at.elapsed() >= PARTITION_UPKEEP_EVERY) && upkeep(&shared).await {
            upkept = Some(Instant::now());
        }
        // Back from an outage, this worker pool's own leases may have lapsed too:
        // renew them first, and reap at the next tick, so that no worker pool reaps
        // work whose owner is alive and only waited for the database.
        if !shared.heartbeat_ok.load(Ordering::Acquire) {
            tracing::debug!("the heartbeat has not renewed leases since it failed; reaping later");
            shared.beat_now.notify_one();
            continue;
        }
        reap(&shared).await;
        advance_stranded(&shared).await;
    }
}

/// Releases keys a finish left blocked with nothing ahead of them. Each one
/// found means a finish and an enqueue met in the window the finishing
/// statement cannot see: worth a warning, never an error.
async fn advance_stranded(shared: &Arc<Shared>) {
    match shared.hot.advance_stranded(REAP_BATCH).await {
        Ok(released) if !released.is_empty() => {
            metrics::counter!("outbox_stranded_keys_released_total")
                .increment(released.len() as u64);
            tracing::warn!(
                jobs = ?released,
                "released ordering keys whose head was blocked with nothing ahead of it"
            );
            shared.wake_at(Instant::now());
        }
        Ok(_) => {}
        Err(error) => {
            tracing::warn!(error = %error, "releasing stranded ordering keys failed; will try again");
        }
    }
}

/// Makes the archive's coming partitions; true when that worked.
async fn upkeep(shared: &Arc<Shared>) -> bool {
    match run_blocking(&shared.pool, |conn| Ok(ensure_done_partitions(conn)?)).await {
        Ok(made) => {
            if made > 0 {
                tracing::info!(made, "made daily partitions of jobs_done");
            }
            true
        }
        Err(error) => {
            // Done jobs still land in jobs_done_default meanwhile: nothing is lost.
            tracing::warn!(error = %error, "could not make jobs_done partitions; will try again");
            false
        }
    }
}

async fn reap(shared: &Arc<Shared>) {
    // A full batch means there may be more: go again at once.
    loop {
        let policy = shared.settings.backoff;
        let margin = shared.settings.reap_margin;
        // This worker pool's own effects still running: their leases lapse only when
        // the heartbeat lost the database, and the next one renews them.
        let live = shared.in_flight.tokens();
        let request = ReapRequest {
            limit: REAP_BATCH,
            margin,
            spare: &live,
        };
        let result = shared.hot.reap(request, policy).await;
        match result {
            Ok(report) if report.total() > 0 => {
                PoolStats::add(&shared.stats.reaped, report.total() as u64);
                metrics::counter!("outbox_jobs_reaped_total", "outcome" => "requeued")
                    .increment(report.requeued as u64);
                metrics::counter!("outbox_jobs_reaped_total", "outcome" => "failed")
                    .increment(report.failed as u64);
                tracing::warn!(
                    requeued = report.requeued,
                    failed = report.failed,
                    "reaped expired leases"
                );
                if let Some(due) = report.next_due {
                    shared.wake_at(Instant::now() + due);
                }
                if report.total() < REAP_BATCH as usize {
                    return;
                }
            }
            Ok(_) => return,
            Err(error) => {
                tracing::warn!(error = %error, "reaping expired leases failed; will try again");
                return;
            }
        }
    }
}
