//! The completer: writes outcomes, many per statement, fenced per claim, and
//! never lets one outcome hold up the others.
//!
//! - The database unreachable (or a transient refusal: a statement or lock
//!   timeout, a deadlock): the batch waits and is tried again with backoff.
//! - A row locked by someone else: the write skips it (SKIP LOCKED) and that
//!   one outcome is tried again shortly.
//! - Any other refusal: the batch is split in halves until the outcome that
//!   causes it stands alone; the rest are written. That outcome is rewritten as
//!   a failure that says why its write failed, and written once more; if even
//!   that is refused, it is dropped with an error in the log, and the reaper
//!   takes the job when its lease runs out. No outcome can block the queue.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::in_flight::Claim;
use super::kind_metrics::KindMetrics;
use super::{MAX_COMPLETION_BATCH, PoolStats, Shared, backoff};
use crate::db::{DbError, Failure};
use crate::outbox::LocalWrite;
use crate::outbox::text::clean_error;
use crate::statements::{Finish, FinishReport, Outcome};
use crate::worker::EffectError;

/// How soon an outcome whose row was locked is tried again.
const BUSY_RETRY: Duration = Duration::from_millis(50);

/// One outcome on its way to the database.
#[derive(Debug)]
pub(super) struct Completion {
    pub finish: Finish,
    /// When the executor decided it. A retry's delay counts from the failure,
    /// so time spent queued here or waiting out a database outage is charged
    /// against it instead of being added on top.
    pub decided: Instant,
    attempt: i32,
    max_attempts: i32,
    kind: Arc<KindMetrics>,
    /// The claim's registration: the heartbeat renews the lease until this
    /// outcome is written and the guard dropped. Held only for its `Drop`.
    #[expect(dead_code, reason = "held for its Drop, which ends the claim")]
    claim: Claim,
    /// The outcome was replaced by a failure after its own write was refused.
    rewritten: bool,
    /// Not before this moment (after an outage, or a locked row).
    not_before: Option<Instant>,
    /// The job held a slot of a concurrency key, which its outcome gives back.
    keyed: bool,
    /// Its `done` may take the standalone finish ([`ClaimedJob::standalone`](crate::statements::ClaimedJob::standalone)).
    standalone: bool,
    /// Writes committed with the outcome, whatever it is
    /// ([`JobContext::write_with_outcome`](crate::worker::JobContext::write_with_outcome)).
    writes: Vec<LocalWrite>,
}

impl Completion {
    pub(super) fn new(
        finish: Finish,
        attempt: i32,
        max_attempts: i32,
        kind: Arc<KindMetrics>,
        claim: Claim,
        keyed: bool,
        standalone: bool,
    ) -> Self {
        Completion {
            finish,
            decided: Instant::now(),
            attempt,
            max_attempts,
            kind,
            claim,
            rewritten: false,
            not_before: None,
            keyed,
            standalone,
            writes: Vec::new(),
        }
    }

    /// The outcome with `writes` to commit beside it.
    pub(super) fn with_writes(mut self, writes: Vec<LocalWrite>) -> Self {
        self.writes = writes;
        self
    }

    /// The outcome as it should be written now.
    fn due_now(&self) -> Finish {
        due_now(&self.finish, self.decided)
    }
}

fn due_now(finish: &Finish, decided: Instant) -> Finish {
    let mut finish = finish.clone();
    if let Outcome::Retry { delay, .. } = &mut finish.outcome {
        *delay = delay.saturating_sub(decided.elapsed());
    }
    finish
}

/// Backoff while the database cannot take writes.
#[derive(Debug, Default)]
struct Outage {
    failures: u32,
    logged: bool,
}

impl Outage {
    fn delay(&self) -> Duration {
        let exponent = self.failures.saturating_sub(1).min(7);
        let base = Duration::from_millis(50) * 2_u32.pow(exponent);
        base.min(Duration::from_secs(5))
            .mul_f64(0.5 + fastrand::f64() / 2.0)
    }
}

/// Runs `writers` completers side by side on one queue of outcomes, until
/// every sender is gone and every outcome is written, or `stop`.
///
/// One writer's statement, which moves each done job into the archive, runs
/// nearly all the time under a deep queue of fast jobs, and the claims wait
/// on it: a second writer fills its batch while the first one's statement
/// runs. More writers do not pay: each free writer takes whatever outcomes
/// are queued when it is ready, so batches shrink into more transactions,
/// and the extra statements compete with the claims for the server's cores
/// (docs/performance.md, "The completer's writers"). Writers take disjoint
/// outcomes (each outcome is in one batch), and lock rows in id order, so
/// they never wait on each other.
pub(super) async fn run_all(
    shared: Arc<Shared>,
    completed: mpsc::Receiver<Completion>,
    stop: CancellationToken,
    writers: usize,
) {
    let completed = Arc::new(tokio::sync::Mutex::new(completed));
    let mut running = tokio::task::JoinSet::new();
    for writer in 0..writers.max(1) {
        running.spawn(run(
            writer,
            Arc::clone(&shared),
            Arc::clone(&completed),
            stop.clone(),
        ));
    }
    while running.join_next().await.is_some() {}
}

/// How many writers a worker pool runs: two, so that one writes while the other's
/// batch fills, since even at the defaults (64 / 16) one writer limits a deep
/// queue of fast jobs (docs/performance.md, "Two completion writers at every
/// concurrency"); one when a single job runs at a time.
pub(super) fn writers_for(concurrency: usize) -> usize {
    if concurrency > 1 { 2 } else { 1 }
}

/// Takes up to a batch of outcomes, waiting for at least one; 0 once the
/// channel is closed and empty. Cancel-safe: dropping it loses nothing.
async fn receive(
    completed: &tokio::sync::Mutex<mpsc::Receiver<Completion>>,
    batch: &mut Vec<Completion>,
) -> usize {
    completed
        .lock()
        .await
        .recv_many(batch, MAX_COMPLETION_BATCH)
        .await
}

/// One writer: runs until every sender is gone and every outcome it took is
/// written, or `stop`.
async fn run(
    writer: usize,
    shared: Arc<Shared>,
    completed: Arc<tokio::sync::Mutex<mpsc::Receiver<Completion>>>,
    stop: CancellationToken,
) {
    let mut waiting: Vec<Completion> = Vec::new();
    let mut outage = Outage::default();
    let mut open = true;
    loop {
        if waiting.is_empty() {
            if !open {
                return;
            }
            shared.liveness.completer_progressed(true);
        }
        let next_try = waiting.iter().filter_map(|c| c.not_before).min();
        let mut batch = Vec::with_capacity(MAX_COMPLETION_BATCH);
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            n = receive(&completed, &mut batch), if open => {
                if n == 0 {
                    open = false;
                }
            }
            () = sleep_until(next_try), if next_try.is_some() => {}
        }
        let now = Instant::now();
        if outage.failures > 0 {
            // New outcomes join the queue behind the outage instead of each
            // paying a failed connection attempt of their own.
            let retry_at = next_try.unwrap_or(now);
            for completion in &mut batch {
                completion.not_before = Some(retry_at);
            }
            waiting.append(&mut batch);
        }
        let (due, later): (Vec<_>, Vec<_>) = waiting
            .drain(..)
            .partition(|c| c.not_before.is_none_or(|at| at <= now));
        waiting = later;
        batch.extend(due);
        if batch.is_empty() {
            continue;
        }
        // Rows are locked in job-id order, as the heartbeat locks them.
        batch.sort_unstable_by_key(|c| c.finish.job_id);
        waiting.extend(write(&shared, writer, batch, &mut outage).await);
    }
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at.into()).await;
    }
}

/// Writes `batch`, splitting it around outcomes the database refuses. Returns
/// the outcomes to try again later.
async fn write(
    shared: &Arc<Shared>,
    writer: usize,
    batch: Vec<Completion>,
    outage: &mut Outage,
) -> Vec<Completion> {
    let mut later = Vec::new();
    let mut parts = vec![batch];
    while let Some(mut part) = parts.pop() {
        let finishes: Vec<Finish> = part.iter().map(Completion::due_now).collect();
        // The retry delays as written, not the whole outcomes: an outcome's
        // local write can be large.
        let written: Vec<Option<Duration>> = finishes
            .iter()
            .map(|f| match &f.outcome {
                Outcome::Retry { delay, .. } => Some(*delay),
                _ => None,
            })
            .collect();
        let writes: Vec<Vec<LocalWrite>> = part.iter().map(|c| c.writes.clone()).collect();
        let standalone: Vec<bool> = part.iter().map(|c| c.standalone).collect();
        let result = shared
            .hot
            .finish(writer, finishes, writes, standalone)
            .await;
        match result {
            Ok(report) => {
                PoolStats::add(&shared.stats.outcome_writes, 1);
                if outage.failures > 0 {
                    tracing::info!(failures = outage.failures, "outcomes written again");
                }
                *outage = Outage::default();
                let freed_a_slot = !report.applied.is_empty() && part.iter().any(|c| c.keyed);
                // Dependents of kinds run elsewhere: their worker pools hear
                // of them from a NOTIFY sent after this commit, never from
                // one inside it (see `HotStatements::finish`).
                let elsewhere: Vec<&str> = report
                    .woken_kinds
                    .iter()
                    .filter(|kind| !shared.settings.kinds.contains(kind))
                    .map(String::as_str)
                    .collect();
                if !elsewhere.is_empty() {
                    shared.waker.wake(elsewhere);
                }
                if report.released > 0 || freed_a_slot {
                    // The next job of an ordering key just became claimable,
                    // or a key held at its limit has room again: claim now,
                    // not at the next poll (a key of max_in_flight 16 would
                    // otherwise run 16 jobs a poll, however fast its receiver).
                    shared.wake.notify_one();
                }
                later.extend(record(shared, part, &written, &report));
            }
            Err(error) => match error.failure() {
                failure @ (Failure::Unavailable | Failure::Transient) => {
                    outage.failures += 1;
                    if !outage.logged {
                        tracing::warn!(error = %error, outcomes = part.len(), "writing outcomes failed; retrying");
                        outage.logged = true;
                    }
                    if failure == Failure::Unavailable {
                        shared
                            .liveness
                            .completer_waiting_for_database(error.to_string());
                    } else {
                        shared.liveness.completer_failed(error.to_string());
                    }
                    let retry_at = Instant::now() + outage.delay();
                    for mut completion in part.into_iter().chain(parts.drain(..).flatten()) {
                        completion.not_before = Some(retry_at);
                        later.push(completion);
                    }
                }
                Failure::Rejected if part.len() > 1 => {
                    let right = part.split_off(part.len() / 2);
                    parts.push(right);
                    parts.push(part);
                }
                Failure::Rejected => {
                    if let Some(completion) = part.pop()
                        && let Some(rewritten) = isolate(shared, completion, &error)
                    {
                        parts.push(vec![rewritten]);
                    }
                }
            },
        }
    }
    shared.liveness.completer_progressed(later.is_empty());
    later
}

/// An outcome the database refused on its own. Returns it rewritten as a
/// failure that says why, or `None` when it had been rewritten already.
fn isolate(shared: &Shared, mut completion: Completion, error: &DbError) -> Option<Completion> {
    PoolStats::add(&shared.stats.isolated, 1);
    metrics::counter!("outbox_outcome_write_errors_total", "kind" => completion.kind.kind.to_string())
        .increment(1);
    let job_id = completion.finish.job_id;
    if completion.rewritten {
        tracing::error!(
            job_id,
            error = %error,
            "could not record this attempt even as a failure; the reaper will take the job when its lease expires"
        );
        return None;
    }
    let status = match &completion.finish.outcome {
        Outcome::Done { .. } => "done",
        Outcome::Retry { .. } => "retry",
        Outcome::Failed { .. } => "failed",
    };
    // The outcome's own text is left out: it may be what the database refused.
    // The runner logged it when it decided the outcome.
    let note = clean_error(&format!(
        "the outcome of attempt {} ({status}) could not be recorded: {error}",
        completion.attempt
    ));
    tracing::error!(job_id, error = %error, "the database refused this outcome; recording it as a failure instead");
    completion.finish.outcome = match &completion.finish.outcome {
        Outcome::Done { .. } => backoff::decide(
            Err(EffectError::retryable(note)),
            completion.attempt,
            completion.max_attempts,
            &shared.settings.backoff,
            fastrand::f64(),
        ),
        Outcome::Retry { delay, .. } => Outcome::Retry {
            delay: *delay,
            error: note,
        },
        Outcome::Failed { .. } => Outcome::Failed { error: note },
    };
    // The writes that rode with it may be what the database refused.
    completion.writes.clear();
    completion.rewritten = true;
    Some(completion)
}

/// Counts what landed; returns the outcomes whose row was locked, to try again.
/// `written` are the retry delays as the statement wrote them, in `batch`'s order.
fn record(
    shared: &Shared,
    batch: Vec<Completion>,
    written: &[Option<Duration>],
    report: &FinishReport,
) -> Vec<Completion> {
    let busy: HashSet<i64> = report.busy.iter().copied().collect();
    let lost: HashSet<i64> = report.lost.iter().copied().collect();
    let mut again = Vec::new();
    for (mut completion, written) in batch.into_iter().zip(written) {
        let finish = &completion.finish;
        let kind = Arc::clone(&completion.kind);
        if busy.contains(&finish.job_id) {
            completion.not_before = Some(Instant::now() + BUSY_RETRY);
            again.push(completion);
            continue;
        }
        if lost.contains(&finish.job_id) {
            PoolStats::add(&shared.stats.lease_lost, 1);
            metrics::counter!("outbox_lease_lost_total", "kind" => kind.kind.to_string())
                .increment(1);
            tracing::warn!(
                job_id = finish.job_id,
                lease_token = finish.lease_token,
                "lease lost: the job was reaped and taken over, or cancelled; this outcome was discarded"
            );
            continue;
        }
        let (counter, outcome) = match &finish.outcome {
            Outcome::Done { .. } => (&shared.stats.done, "done"),
            Outcome::Retry { .. } => {
                // The row's run_after is the statement's now() plus the delay
                // written, and the statement is over by now: waking this long
                // from here never comes before the job is due.
                if let Some(delay) = written {
                    shared.wake_at(Instant::now() + *delay);
                }
                (&shared.stats.retried, "retried")
            }
            Outcome::Failed { .. } => (&shared.stats.failed, "failed"),
        };
        PoolStats::add(counter, 1);
        kind.finished(outcome).increment(1);
    }
    again
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finish(outcome: Outcome) -> Finish {
        Finish {
            job_id: 1,
            lease_token: 1,
            outcome,
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
        let due = due_now(
            &finish(retry(Duration::from_secs(10))),
            Instant::now() - Duration::from_secs(3),
        );
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
        let due = due_now(
            &finish(retry(Duration::from_secs(1))),
            Instant::now() - Duration::from_secs(5),
        );
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
        let due = due_now(
            &finish(failed.clone()),
            Instant::now() - Duration::from_secs(5),
        );
        assert_eq!(due.outcome, failed);
    }

    #[test]
    fn the_outage_backoff_grows_and_is_capped() {
        let mut outage = Outage::default();
        let mut previous_cap = Duration::ZERO;
        for failures in 1..20 {
            outage.failures = failures;
            let d = outage.delay();
            assert!(d <= Duration::from_secs(5), "{d:?}");
            let cap = (Duration::from_millis(50) * 2_u32.pow((failures - 1).min(7)))
                .min(Duration::from_secs(5));
            assert!(d >= cap / 2 && cap >= previous_cap, "{failures}: {d:?}");
            previous_cap = cap;
        }
    }
}
