//! The jobs table: enqueue, claim, finish (fenced), heartbeat, reap, admin.
//!
//! Plain CRUD uses Diesel's DSL. The queue statements, whose safety under many
//! concurrent workers is the point, are raw SQL in `sql/`, one statement a file,
//! each opening with a comment on the index it relies on and why it is safe.

mod archive;
mod cancel;
mod claim;
mod finish;
mod job;
mod keys;
mod lease;
mod prune;
mod reap;
mod retry;
mod stats;
pub mod text;
mod wake;

use diesel::prelude::*;
use diesel::sql_types::Text;
use serde::Serialize;

pub use archive::{PARTITION_UPKEEP_EVERY, ensure_done_partitions};
pub use cancel::{CancelRefusal, CancelReport, cancel_job_batch, cancel_jobs};
pub use claim::{ClaimPosition, ClaimRequest, ClaimedJob, claim_jobs, claim_jobs_after};
pub use finish::{CommitHook, Finish, FinishReport, LocalWrite, Outcome, finish_jobs};
pub use job::{JobOptions, NewJob, enqueue_job};
pub use keys::{BlockedKey, blocked_keys, release_stranded_keys};
pub use lease::{HeartbeatReport, JobLease, extend_leases, release_jobs};
pub use prune::{PruneReport, count_prunable, prune_done_jobs};
pub use reap::{ReapReport, ReapRequest, reap_expired_leases};
pub use retry::{RetryRefusal, RetryReport, RetrySelection, retry_failed_jobs};
pub use stats::{KindStats, QueueDepth, QueueStats, queue_depth, queue_stats};
pub use wake::Waker;

use crate::schema::jobs;

/// The channel `enqueue` notifies and relays LISTEN on. The payload is the job's kind.
pub const NOTIFY_CHANNEL: &str = "outbox_jobs";

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
    /// Claimed by a relay (`locked_by`) under a lease (`lease_expires_at`) and
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

/// Inserts one job and notifies relays, inside whatever transaction `conn` is in:
/// if the caller's transaction rolls back, the job and the notification vanish
/// with it. Returns the job's id.
///
/// ```no_run
/// use diesel::Connection as _;
/// use outbox_core::outbox::{enqueue, NewJob};
///
/// # fn demo(conn: &mut diesel::PgConnection) -> diesel::QueryResult<()> {
/// conn.transaction(|conn| {
///     // ... your own writes on `conn` ...
///     let job_id = enqueue(conn, &NewJob::new("noop", serde_json::json!({"hello": "world"})))?;
///     println!("enqueued job {job_id}");
///     Ok(())
/// })
/// # }
/// ```
pub fn enqueue(conn: &mut PgConnection, job: &NewJob) -> QueryResult<i64> {
    if job.ordering_key.is_some() {
        return enqueue_many(conn, std::slice::from_ref(job))?
            .pop()
            .ok_or(diesel::result::Error::NotFound);
    }
    let id = diesel::insert_into(jobs::table)
        .values(job)
        .returning(jobs::id)
        .get_result(conn)?;
    notify(conn, [job.kind.as_str()])?;
    Ok(id)
}

/// Inserts several jobs with one statement and one NOTIFY per distinct kind.
/// Jobs with an ordering key are queued behind their key's unfinished jobs, and
/// behind earlier jobs of the same key in `new_jobs`.
pub fn enqueue_many(conn: &mut PgConnection, new_jobs: &[NewJob]) -> QueryResult<Vec<i64>> {
    enqueue_many_with(conn, new_jobs, insert_jobs)
}

/// [`enqueue_many`], writing the rows with `insert`.
pub fn enqueue_many_with(
    conn: &mut PgConnection,
    new_jobs: &[NewJob],
    insert: InsertJobs,
) -> QueryResult<Vec<i64>> {
    let ids = enqueue_many_unnotified_with(conn, new_jobs, insert)?;
    notify(conn, new_jobs.iter().map(|j| j.kind.as_str()))?;
    Ok(ids)
}

/// Wakes the relays of `kinds` when the current transaction commits (at once
/// outside one): one NOTIFY per distinct kind, in one round trip.
pub fn notify<'a>(
    conn: &mut PgConnection,
    kinds: impl IntoIterator<Item = &'a str>,
) -> QueryResult<()> {
    let mut kinds: Vec<&str> = kinds.into_iter().collect();
    kinds.sort_unstable();
    kinds.dedup();
    if kinds.is_empty() {
        return Ok(());
    }
    diesel::sql_query(include_str!("sql/notify_in_transaction.sql"))
        .bind::<Text, _>(NOTIFY_CHANNEL)
        .bind::<diesel::sql_types::Array<Text>, _>(&kinds)
        .execute(conn)
        .map(drop)
}

/// [`enqueue_many`] without the NOTIFY: for callers that wake relays after
/// their transaction commits, through a [`Waker`], so that their commits do
/// not queue on PostgreSQL's notify lock. Until something wakes them, relays
/// find the jobs at their next poll.
pub fn enqueue_many_unnotified(
    conn: &mut PgConnection,
    new_jobs: &[NewJob],
) -> QueryResult<Vec<i64>> {
    enqueue_many_unnotified_with(conn, new_jobs, insert_jobs)
}

/// How the rows of an enqueue are written, once the queue has decided which
/// of them wait behind their ordering key ([`NewJob::is_blocked`]): one
/// multi-row INSERT that returns the ids in row order. [`insert_jobs`] writes
/// the queue's columns; an application that added columns of its own to
/// `jobs` passes its own, which writes those too.
pub type InsertJobs = fn(&mut PgConnection, &[NewJob]) -> QueryResult<Vec<i64>>;

/// [`enqueue_many_unnotified`], writing the rows with `insert`.
pub fn enqueue_many_unnotified_with(
    conn: &mut PgConnection,
    new_jobs: &[NewJob],
    insert: InsertJobs,
) -> QueryResult<Vec<i64>> {
    if new_jobs.is_empty() {
        return Ok(Vec::new());
    }
    let mut keys: Vec<&str> = new_jobs
        .iter()
        .filter_map(|j| j.ordering_key.as_deref())
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let ids = if keys.is_empty() {
        insert(conn, new_jobs)?
    } else {
        // The key locks must live until the enqueuing transaction commits.
        // Inside the caller's transaction (the one that wrote the rows the jobs are for) they do as they
        // are; outside one, a transaction of our own makes sure there is one.
        // A savepoint would only add two round trips to every enqueuing transaction.
        use diesel::connection::{AnsiTransactionManager, TransactionManager as _};
        let in_transaction = AnsiTransactionManager::transaction_manager_status_mut(conn)
            .transaction_depth()
            .is_ok_and(|depth| depth.is_some());
        if in_transaction {
            insert_keyed(conn, new_jobs, &keys, insert)?
        } else {
            conn.transaction(|conn| insert_keyed(conn, new_jobs, &keys, insert))?
        }
    };
    Ok(ids)
}

/// [`enqueue_many_unnotified`] for jobs whose ordering keys no other job can
/// have: keys named after a row the caller's transaction has just created (say
/// `invoice-<id>-emails` for an invoice it just inserted), which no other transaction can see
/// before this one commits, so it cannot have enqueued under them. The first
/// job of each key is claimable, later ones wait behind it, and the key locks
/// and head lookups (two round trips) are skipped. A key that does have older
/// jobs would break ordered delivery: use [`enqueue_many`] when in doubt.
pub fn enqueue_many_with_new_keys_unnotified(
    conn: &mut PgConnection,
    new_jobs: &[NewJob],
) -> QueryResult<Vec<i64>> {
    enqueue_many_with_new_keys_unnotified_with(conn, new_jobs, insert_jobs)
}

/// [`enqueue_many_with_new_keys_unnotified`], writing the rows with `insert`.
pub fn enqueue_many_with_new_keys_unnotified_with(
    conn: &mut PgConnection,
    new_jobs: &[NewJob],
    insert: InsertJobs,
) -> QueryResult<Vec<i64>> {
    insert(
        conn,
        &queue_behind(new_jobs, &std::collections::HashSet::new()),
    )
}

/// `new_jobs` with `blocked` set for each job whose key is in `busy` (has an
/// unfinished job) or appeared earlier in `new_jobs`.
fn queue_behind(new_jobs: &[NewJob], busy: &std::collections::HashSet<String>) -> Vec<NewJob> {
    let mut started = std::collections::HashSet::new();
    new_jobs
        .iter()
        .map(|job| {
            let mut job = job.clone();
            if let Some(key) = job.ordering_key.clone() {
                job.blocked = busy.contains(&key) || !started.insert(key);
            }
            job
        })
        .collect()
}

/// Inserts `new_jobs`, whose ordering keys are `keys`, each queued behind its
/// key's unfinished jobs. Runs inside a transaction, which holds the locks.
fn insert_keyed(
    conn: &mut PgConnection,
    new_jobs: &[NewJob],
    keys: &[&str],
    insert: InsertJobs,
) -> QueryResult<Vec<i64>> {
    diesel::sql_query(include_str!("sql/lock_ordering_keys.sql"))
        .bind::<diesel::sql_types::Array<Text>, _>(keys)
        .execute(conn)?;
    let busy: std::collections::HashSet<String> =
        diesel::sql_query(include_str!("sql/lock_ordering_heads.sql"))
            .bind::<diesel::sql_types::Array<Text>, _>(keys)
            .load::<KeyRow>(conn)?
            .into_iter()
            .map(|r| r.key)
            .collect();
    insert(conn, &queue_behind(new_jobs, &busy))
}

/// The queue's [`InsertJobs`]: its own columns, one multi-row INSERT.
pub fn insert_jobs(conn: &mut PgConnection, new_jobs: &[NewJob]) -> QueryResult<Vec<i64>> {
    // One multi-row INSERT draws the ids in row order: enqueue order.
    diesel::insert_into(jobs::table)
        .values(new_jobs)
        .returning(jobs::id)
        .get_results(conn)
}

#[derive(QueryableByName)]
struct KeyRow {
    #[diesel(sql_type = Text)]
    key: String,
}

/// Releases the next job of each key in `keys` whose earlier jobs have all
/// ended (after an operator cancelled one). Returns the ids released.
pub fn release_ordering_keys(conn: &mut PgConnection, keys: &[String]) -> QueryResult<Vec<i64>> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    #[derive(QueryableByName)]
    struct IdRow {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        id: i64,
    }
    Ok(
        diesel::sql_query(include_str!("sql/release_ordering_keys.sql"))
            .bind::<diesel::sql_types::Array<Text>, _>(keys)
            .load::<IdRow>(conn)?
            .into_iter()
            .map(|r| r.id)
            .collect(),
    )
}
