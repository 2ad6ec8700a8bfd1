//! The completer: writes outcomes, many per statement, fenced per job.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{MAX_COMPLETION_BATCH, RelayStats, Shared};
use crate::db::run_blocking;
use crate::outbox::{Finish, Outcome, finish_jobs};

/// One outcome on its way to the database.
#[derive(Debug)]
pub(super) struct Completion {
    pub finish: Finish,
    /// When the executor decided it. A retry's delay counts from the failure,
    /// so time spent queued here or waiting out a database outage is charged
    /// against it instead of being added on top.
    pub decided: Instant,
}

impl Completion {
    /// The outcome as it should be written now.
    fn due_now(&self) -> Finish {
        let mut finish = self.finish.clone();
        if let Outcome::Retry { delay, .. } = &mut finish.outcome {
            *delay = delay.saturating_sub(self.decided.elapsed());
        }
        finish
    }
}

/// Runs until every sender is gone and the channel is drained, or `stop`.
pub(super) async fn run(
    shared: Arc<Shared>,
    mut completed: mpsc::Receiver<Completion>,
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
        // Rows are locked in job-id order, as the heartbeat locks them, so the
        // two never wait on each other in opposite orders.
        batch.sort_unstable_by_key(|c| c.finish.job_id);
        if !write(&shared, &batch, &stop).await {
            return;
        }
        batch.clear();
    }
}

/// Writes one batch, retrying while the database is unreachable. False if
/// `stop` came first.
async fn write(shared: &Arc<Shared>, batch: &[Completion], stop: &CancellationToken) -> bool {
    let mut delays = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_secs(5))
        .with_jitter()
        .without_max_times()
        .build();
    let mut failures = 0_u32;
    loop {
        let worker = shared.settings.worker_id.clone();
        let finishes: Vec<Finish> = batch.iter().map(Completion::due_now).collect();
        match run_blocking(&shared.pool, move |conn| {
            Ok(finish_jobs(conn, &worker, &finishes)?)
        })
        .await
        {
            Ok(report) => {
                RelayStats::add(&shared.stats.outcome_writes, 1);
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

fn record(shared: &Shared, batch: &[Completion], lost: &[i64]) {
    let mut in_flight = shared.in_flight();
    for Completion { finish, .. } in batch {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(outcome: Outcome, age: Duration) -> Completion {
        Completion {
            finish: Finish {
                job_id: 1,
                attempt: 1,
                outcome,
            },
            decided: Instant::now() - age,
        }
    }

    fn retry(delay: Duration) -> Outcome {
        Outcome::Retry {
            delay,
            error: "503".to_owned(),
        }
    }

    #[test]
    fn time_spent_waiting_for_the_completer_is_taken_off_a_retry_delay() {
        let due = completion(retry(Duration::from_secs(10)), Duration::from_secs(3)).due_now();
        let Outcome::Retry { delay, .. } = due.outcome else {
            panic!("still a retry: {due:?}");
        };
        assert!(
            delay <= Duration::from_secs(7) && delay > Duration::from_secs(6),
            "{delay:?}"
        );
    }

    #[test]
    fn a_retry_that_waited_out_its_delay_is_due_at_once() {
        let due = completion(retry(Duration::from_secs(1)), Duration::from_secs(5)).due_now();
        assert_eq!(
            due.outcome,
            retry(Duration::ZERO),
            "a delay never goes negative"
        );
    }

    #[test]
    fn other_outcomes_are_written_as_decided() {
        let failed = Outcome::Failed {
            error: "550".to_owned(),
        };
        let due = completion(failed.clone(), Duration::from_secs(5)).due_now();
        assert_eq!(due.outcome, failed);
    }
}
