//! What a worker knows about the attempt it performs.

use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::outbox::LocalWrite;
use crate::statements::ClaimedJob;

/// The attempt a worker performs: which job, which try, the fencing token of
/// the claim, and a signal that the worker pool wants the attempt to stop.
#[derive(Debug, Clone)]
pub struct JobContext {
    id: i64,
    kind: String,
    attempt: i32,
    max_attempts: i32,
    lease_token: i64,
    created_at: DateTime<Utc>,
    unfinished_parents: Vec<i64>,
    cancel: CancellationToken,
    /// Writes to commit with this attempt's outcome, whatever it is: shared
    /// with the worker pool, which takes them when the worker returns.
    with_outcome: Arc<Mutex<Vec<LocalWrite>>>,
}

impl JobContext {
    /// The context of `job`'s current claim; `cancel` fires when the attempt
    /// should stop. A worker pool builds this; build one yourself to run a worker
    /// outside a worker pool (in a test, say), with a token you control.
    pub fn new(job: &ClaimedJob, cancel: CancellationToken) -> Self {
        JobContext {
            id: job.id,
            kind: job.kind.clone(),
            attempt: job.attempt,
            max_attempts: job.max_attempts,
            lease_token: job.lease_token,
            created_at: job.created_at,
            unfinished_parents: job.unfinished_parents.clone().unwrap_or_default(),
            cancel,
            with_outcome: Arc::default(),
        }
    }

    /// Commits `write` in the transaction that records this attempt's
    /// outcome, whatever the outcome (done, retry or failed), and only if
    /// that outcome is recorded: the fenced finish matched this claim. A
    /// record of the attempt itself (what was sent, what came back) belongs
    /// here: it costs no transaction of its own, and whoever sees the
    /// outcome sees it, while a zombie whose lease was lost writes nothing.
    /// A [`LocalWrite`] returned with a success is for what exists only when
    /// the job is done; this is for what every attempt leaves. Writes made
    /// after the worker returned are not written.
    pub fn write_with_outcome(&self, write: LocalWrite) {
        self.with_outcome
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(write);
    }

    /// Where [`JobContext::write_with_outcome`] gathers its writes, for the
    /// worker pool to take once the worker returned.
    pub(crate) fn outcome_writes(&self) -> OutcomeWrites {
        OutcomeWrites(Arc::clone(&self.with_outcome))
    }

    /// The job's id (`jobs.id`): stable across attempts, so it makes a good
    /// idempotency key for the receiver of an effect.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The job's kind.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// This attempt's number: 1 for the first run.
    pub fn attempt(&self) -> i32 {
        self.attempt
    }

    /// The attempt after which a retryable failure becomes `failed`.
    pub fn max_attempts(&self) -> i32 {
        self.max_attempts
    }

    /// The fencing token of this claim, unique across all claims ever made.
    /// Every write the worker pool makes for this attempt presents it; an effect
    /// with a store of its own can fence its writes with it the same way.
    pub fn lease_token(&self) -> i64 {
        self.lease_token
    }

    /// When the job was enqueued.
    pub fn created_at(&self) -> DateTime<Utc> {
        self.created_at
    }

    /// The parents that did not finish `done` (they ended `failed` or
    /// `cancelled`), for a job enqueued with policy `run`
    /// ([`JobOptions::depends_on`](crate::outbox::JobOptions::depends_on)):
    /// it runs without their work, and should do without it. Empty when
    /// every parent finished, and for a job without parents.
    pub fn unfinished_parents(&self) -> &[i64] {
        &self.unfinished_parents
    }

    /// Completes when the worker pool takes the attempt away: its lease was lost
    /// (another worker pool owns the job now, or an operator cancelled it), its
    /// deadline passed, or the worker pool is shutting down past its grace. The
    /// worker pool drops the worker's future right after, so this is for what the
    /// worker started beside it (a spawned upload, a child process) to stop.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.cancel.cancelled()
    }

    /// True once [`JobContext::cancelled`] has fired.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }
}

/// The writes of one attempt's [`JobContext::write_with_outcome`].
pub(crate) struct OutcomeWrites(Arc<Mutex<Vec<LocalWrite>>>);

impl OutcomeWrites {
    /// The writes gathered so far, taken.
    pub(crate) fn take(&self) -> Vec<LocalWrite> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}
