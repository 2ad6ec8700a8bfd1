//! The runner: runs one job's effect, within its deadline and only while its
//! lease holds, and hands its outcome to the completer.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use futures_util::FutureExt as _;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::completer::Completion;
use super::in_flight::Claim;
use super::kind_metrics::KindMetrics;
use super::{PoolStats, Shared, backoff};
use crate::statements::ClaimedJob;
use crate::statements::{Finish, Outcome};
use crate::worker::{EffectError, JobContext};

pub(super) async fn run(
    shared: Arc<Shared>,
    job: ClaimedJob,
    kind: Arc<KindMetrics>,
    claim: Claim,
    permit: OwnedSemaphorePermit,
    completions: mpsc::Sender<Completion>,
    interrupt: Arc<CancellationToken>,
) {
    let span = tracing::info_span!(
        "job",
        job_id = job.id,
        kind = %job.kind,
        attempt = job.attempt,
        lease_token = job.lease_token,
        trace_id = tracing::field::Empty,
    );
    crate::trace_context::continue_stored(&span, job.trace_context.as_ref());
    async move {
        let started = Instant::now();
        let deadline = shared.settings.job_timeouts.for_kind(&job.kind);
        // Fires with the lease's loss or when the deadline or shutdown takes
        // the attempt away, just before its future is dropped. The claim's
        // own token, not a child of it: a child links into its parent under
        // the parent's lock and unlinks when dropped, which was 7% of the
        // relay's CPU in a drain of no-op jobs, for a token whose attempt
        // ends here either way.
        let ctx = JobContext::new(&job, claim.lost().clone());
        let with_outcome = ctx.outcome_writes();
        let effect = AssertUnwindSafe(shared.executor.execute(&job, ctx)).catch_unwind();
        // Dropping the effect's future is what cancels it: a send in progress is
        // abandoned at its next await point.
        let result = tokio::select! {
            biased;
            result = effect => result.unwrap_or_else(|panic| {
                let reason = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".to_owned());
                Err(EffectError::retryable(format!("effect panicked: {reason}")))
            }),
            () = claim.lost().cancelled() => {
                // Another worker pool owns the job now (or an operator cancelled it):
                // stop, and write nothing, since nothing we write would land.
                PoolStats::add(&shared.stats.lease_lost, 1);
                metrics::counter!("outbox_lease_lost_total", "kind" => job.kind.clone()).increment(1);
                tracing::warn!(
                    ran_for = ?started.elapsed(),
                    "lease lost while the effect ran; the effect was cancelled and its outcome discarded"
                );
                drop(claim);
                drop(permit);
                return;
            }
            () = tokio::time::sleep(deadline) => {
                claim.lost().cancel();
                PoolStats::add(&shared.stats.timed_out, 1);
                metrics::counter!("outbox_jobs_timed_out_total", "kind" => job.kind.clone()).increment(1);
                Err(EffectError::retryable(format!(
                    "deadline exceeded: the effect ran longer than its timeout of {} (RELAY_JOB_TIMEOUT) and was cancelled",
                    humantime::format_duration(deadline)
                )))
            }
            () = interrupt.cancelled() => {
                claim.lost().cancel();
                Err(EffectError::retryable(
                    "interrupted: the relay shut down before the effect finished",
                ))
            }
        };
        let took = started.elapsed();
        shared.effect_time.record(took);
        kind.effect_duration.record(took.as_secs_f64());

        let outcome = backoff::decide(
            result,
            job.attempt,
            job.max_attempts,
            &shared.settings.backoff,
            fastrand::f64(),
        );
        match &outcome {
            Outcome::Done { .. } => tracing::debug!("effect succeeded"),
            Outcome::Retry { delay, error } => {
                tracing::warn!(retry_in = ?delay, error = %error, "effect failed; will retry");
            }
            Outcome::Failed { error } => tracing::error!(error = %error, "effect failed for good"),
        }
        let completion = Completion::new(
            Finish {
                job_id: job.id,
                lease_token: job.lease_token,
                outcome,
            },
            job.attempt,
            job.max_attempts,
            kind,
            claim,
            job.concurrency_key.is_some(),
            job.standalone,
        )
        .with_writes(with_outcome.take());
        if completions.send(completion).await.is_err() {
            // Only after the completer gave up at shutdown: the lease will expire.
            tracing::warn!("outcome not recorded; the reaper will requeue the job");
        }
        drop(permit);
    }
    .instrument(span)
    .await;
}
