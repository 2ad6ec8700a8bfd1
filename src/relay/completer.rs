//! The completer: writes outcomes, many per statement, fenced per job.

use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{MAX_COMPLETION_BATCH, RelayStats, Shared};
use crate::db::run_blocking;
use crate::outbox::{Finish, Outcome, finish_jobs};

/// Runs until every sender is gone and the channel is drained, or `stop`.
pub(super) async fn run(
    shared: Arc<Shared>,
    mut completed: mpsc::Receiver<Finish>,
    stop: CancellationToken,
) {
    let mut batch = Vec::with_capacity(MAX_COMPLETION_BATCH);
    loop {
        let received = tokio::select! {
            () = stop.cancelled() => return,
            n = completed.recv_many(&mut batch, MAX_COMPLETION_BATCH) => n,
        };
        if received == 0 {
            return;
        }
        if !write(&shared, &batch, &stop).await {
            return;
        }
        batch.clear();
    }
}

/// Writes one batch, retrying while the database is unreachable. False if
/// `stop` came first.
async fn write(shared: &Arc<Shared>, batch: &[Finish], stop: &CancellationToken) -> bool {
    let mut delays = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_secs(5))
        .with_jitter()
        .without_max_times()
        .build();
    let mut failures = 0_u32;
    loop {
        let worker = shared.settings.worker_id.clone();
        let finishes = batch.to_vec();
        match run_blocking(&shared.pool, move |conn| {
            Ok(finish_jobs(conn, &worker, &finishes)?)
        })
        .await
        {
            Ok(report) => {
                record(shared, batch, &report.lost);
                if failures > 0 {
                    tracing::info!(failures, "outcomes written after the database came back");
                }
                return true;
            }
            Err(error) => {
                failures += 1;
                if failures == 1 {
                    tracing::warn!(error = %error, outcomes = batch.len(), "writing outcomes failed; retrying");
                }
                let delay = delays.next().unwrap_or(Duration::from_secs(5));
                tokio::select! {
                    () = stop.cancelled() => return false,
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

fn record(shared: &Shared, batch: &[Finish], lost: &[i64]) {
    let mut in_flight = shared.in_flight();
    for finish in batch {
        let kind = in_flight
            .remove(&finish.job_id)
            .map(|f| f.kind)
            .unwrap_or_default();
        if lost.contains(&finish.job_id) {
            RelayStats::add(&shared.stats.lease_lost, 1);
            metrics::counter!("outbox_lease_lost_total", "kind" => kind).increment(1);
            tracing::warn!(
                job_id = finish.job_id,
                attempt = finish.attempt,
                "lease lost: the job was reaped and taken over; this outcome was discarded"
            );
            continue;
        }
        let (counter, outcome) = match finish.outcome {
            Outcome::Done { .. } => (&shared.stats.done, "done"),
            Outcome::Retry { .. } => (&shared.stats.retried, "retried"),
            Outcome::Failed { .. } => (&shared.stats.failed, "failed"),
        };
        RelayStats::add(counter, 1);
        metrics::counter!("outbox_jobs_finished_total", "kind" => kind, "outcome" => outcome)
            .increment(1);
    }
}
