//! The executor: runs one job's effect and hands its outcome to the completer.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use futures_util::FutureExt as _;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::completer::Completion;
use super::{Shared, backoff};
use crate::effects::EffectError;
use crate::outbox::{ClaimedJob, Finish, Outcome};

pub(super) async fn run(
    shared: Arc<Shared>,
    job: ClaimedJob,
    permit: OwnedSemaphorePermit,
    completions: mpsc::Sender<Completion>,
    interrupt: CancellationToken,
) {
    let span = tracing::info_span!(
        "job",
        job_id = job.id,
        kind = %job.kind,
        attempt = job.attempt,
        order_id = job.order_id,
        trace_id = tracing::field::Empty,
    );
    crate::trace_context::continue_stored(&span, job.trace_context.as_ref());
    async move {
        let started = Instant::now();
        let effect = AssertUnwindSafe(shared.executor.execute(&job)).catch_unwind();
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
            () = interrupt.cancelled() => Err(EffectError::retryable(
                "interrupted: the relay shut down before the effect finished",
            )),
        };
        metrics::histogram!("outbox_effect_duration_seconds", "kind" => job.kind.clone())
            .record(started.elapsed().as_secs_f64());

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
        let finish = Finish {
            job_id: job.id,
            attempt: job.attempt,
            outcome,
        };
        let completion = Completion {
            finish,
            decided: Instant::now(),
        };
        if completions.send(completion).await.is_err() {
            // Only after the completer gave up at shutdown: the lease will expire.
            tracing::warn!("outcome not recorded; the reaper will requeue the job");
        }
        drop(permit);
    }
    .instrument(span)
    .await;
}
