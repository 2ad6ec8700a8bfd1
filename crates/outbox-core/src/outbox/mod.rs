//! The jobs table as an application sees it: enqueue (now, at a time, or
//! periodically), cancel in the caller's transaction, the job and its
//! status, and the operator's actions (retry, cancel, blocked keys, prune,
//! stats). The worker pool's own statements (claim, finish, heartbeat, reap) live
//! here too, and are public only through [`crate::statements`].
//!
//! Plain CRUD uses Diesel's DSL. The queue statements, whose safety under many
//! concurrent workers is the point, are raw SQL in `sql/`, one statement a file,
//! each opening with a comment on the index it relies on and why it is safe.

pub(crate) mod archive;
mod args;
mod cancel;
pub(crate) mod claim;
pub(crate) mod claim_plan;
pub(crate) mod depend;
mod enqueue;
pub(crate) mod fence;
pub(crate) mod finish;
mod job;
pub(crate) mod lease;
mod limits;
pub(crate) mod ordering_keys;
mod own_insert;
mod periodic;
pub(crate) mod prepared;
mod prune;
pub(crate) mod reap;
mod retry;
mod standalone;
mod stats;
pub(crate) mod text;
mod wake;

use serde::Serialize;

pub use args::JobArgs;
pub use cancel::{CancelOutcome, CancelRefusal, CancelReport, cancel_job_batch, cancel_jobs};
pub use depend::{DependencyError, DependencyPolicy, HeldDependent, Parent, held_dependents};
pub use enqueue::{Enqueuer, INSERT_CHUNK, InsertJobs};
pub use finish::{CommitHook, HookRow, LocalWrite};
pub use job::{JobOptions, NewJob};
pub use limits::{
    ConcurrencyLimit, ConcurrencyLimitError, ConcurrencyState, concurrency_state,
    remove_concurrency_limit, set_concurrency_limit,
};
pub use ordering_keys::{BlockedKey, blocked_keys};
pub use own_insert::OwnInsert;
pub use periodic::{
    EnqueuedSlot, InvalidPeriodicJob, MIN_PERIODIC_INTERVAL, PeriodicJob, PeriodicSchedule,
    Schedule, declare_periodic_jobs, enqueue_due_slot, periodic_schedules,
};
pub use prune::{PruneReport, count_prunable, prune_done_jobs};
pub use retry::{RetryRefusal, RetryReport, RetrySelection, retry_failed_jobs};
pub use stats::{KindStats, QueueDepth, QueueStats, queue_depth, queue_stats};
pub use wake::Waker;

/// The channel an [`Enqueuer`] notifies and worker pools LISTEN on. The payload is the job's kind.
pub(crate) const NOTIFY_CHANNEL: &str = "outbox_jobs";

/// `max_attempts` for jobs enqueued without one (`JOB_MAX_ATTEMPTS`): the
/// claims a job gets before a retryable failure leaves it `failed`.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 8;

/// A job's status (ARCHITECTURE.md, "The job state machine"); the
/// `jobs_status_valid` CHECK constraint holds the same set.
///
/// A job moves `pending -> processing -> done | failed`: a claim makes it
/// `processing`, its outcome makes it `done`, `failed`, or `pending` again
/// for a retry; the reaper returns a `processing` job whose lease expired to
/// `pending` (or `failed`, out of attempts). An operator may retry a
/// `failed` job (back to `pending`) or cancel a `pending` or `failed` one.
/// Stored as the lowercase name ([`JobStatus::as_str`], also its serde form).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Waiting to be claimed: due once `run_after <= now()` and, with an
    /// ordering key, once no earlier job of its key is unfinished (until then
    /// it is `blocked`). New jobs, retries and requeued jobs are pending.
    Pending,
    /// Claimed by a worker pool (`locked_by`) under a lease (`lease_expires_at`) and
    /// a fencing token (`lease_token`); its effect may be running. Only the
    /// holder of that token can finish it; if the lease runs out, the reaper
    /// takes it back. Cannot be cancelled.
    Processing,
    /// The effect succeeded. Terminal: the job has left `jobs` for the
    /// `jobs_done` archive, in the statement that recorded it (read it through
    /// `jobs_all`), and it frees the next job of its ordering key.
    Done,
    /// A permanent error, or a retryable one on the last attempt (or a lease
    /// that expired on it). Stays in `jobs` with `last_error` and
    /// `finished_at`, and holds its ordering key, until an operator retries
    /// or cancels it.
    Failed,
    /// An operator gave up on the job (`jobs cancel`, the dashboard). Terminal.
    /// Only a `pending` or `failed` job can be cancelled; it stays in `jobs`
    /// with `finished_at` set, and frees the next job of its ordering key as
    /// `done` does.
    Cancelled,
}

impl JobStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [JobStatus; 5] = [
        JobStatus::Pending,
        JobStatus::Processing,
        JobStatus::Done,
        JobStatus::Failed,
        JobStatus::Cancelled,
    ];

    /// The status as stored in `jobs.status`: `"pending"`, `"processing"`,
    /// `"done"`, `"failed"` or `"cancelled"`. [`str::parse`] reads it back.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Pending => "pending",
            JobStatus::Processing => "processing",
            JobStatus::Done => "done",
            JobStatus::Failed => "failed",
            JobStatus::Cancelled => "cancelled",
        }
    }
}

impl std::str::FromStr for JobStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown status {s:?} (expected pending, processing, done, failed or cancelled)"
                )
            })
    }
}

impl std::fmt::Display for JobStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
