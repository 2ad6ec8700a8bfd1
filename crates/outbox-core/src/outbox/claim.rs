//! Claiming due jobs: the `FOR UPDATE SKIP LOCKED` CTE.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Integer, Nullable, Text, Timestamptz};

/// What a worker pool asks for.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// `locked_by` for the claimed jobs.
    pub worker_id: &'a str,
    /// Only jobs of these kinds are claimed.
    pub kinds: &'a [String],
    /// Most jobs to claim; a worker pool passes its free slots, never more. Zero or
    /// less claims nothing (without a round trip), as does an empty `kinds`.
    pub limit: i64,
    /// How long the claimed jobs are this worker's without a heartbeat:
    /// `lease_expires_at` becomes the database's `now()` plus this (to the
    /// millisecond). Past it (and the reaper's margin) the reaper may hand
    /// the job to someone else, and this claim's writes are fenced out.
    pub lease: Duration,
}

/// A job this worker now owns until `lease` runs out.
///
/// The row is `processing`, `locked_by` the claiming worker, and stays so
/// until an outcome is written with [`finish_jobs`](crate::statements::finish_jobs), the
/// job is handed back with [`hand_back_jobs`](crate::statements::hand_back_jobs), or its
/// lease expires and the reaper takes it. Each of these writes presents
/// [`ClaimedJob::lease_token`]; keep extending the lease with
/// [`extend_leases`](crate::statements::extend_leases) while the effect runs.
#[derive(Debug, Clone, QueryableByName)]
pub struct ClaimedJob {
    /// The job's id (`jobs.id`): the same for every attempt of the job.
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    /// The job's kind, one of [`ClaimRequest::kinds`]: which worker runs it.
    #[diesel(sql_type = Text)]
    pub kind: String,
    /// The job's arguments as enqueued, undecoded; a worker registry decodes
    /// them into the kind's [`JobArgs`](crate::worker::JobArgs).
    #[diesel(sql_type = diesel::sql_types::Jsonb)]
    pub payload: serde_json::Value,
    /// This claim's attempt number (1 for the first run). Every claim counts
    /// one, whether its attempt ends in an outcome or in an expired lease; a
    /// release at shutdown gives it back. An operator's retry resets it to 0.
    #[diesel(sql_type = Integer, column_name = attempts)]
    pub attempt: i32,
    /// The attempt after which a retryable failure makes the job `failed`:
    /// when `attempt >= max_attempts`, this is the last try.
    #[diesel(sql_type = Integer)]
    pub max_attempts: i32,
    /// The fencing token of this claim, unique across all claims ever made:
    /// every later write of this attempt (heartbeat, finish, release) presents it.
    #[diesel(sql_type = BigInt)]
    pub lease_token: i64,
    /// When the job was enqueued (the enqueuing transaction's time).
    #[diesel(sql_type = diesel::sql_types::Timestamptz)]
    pub created_at: DateTime<Utc>,
    /// The trace context of whoever enqueued the job (`jobs.trace_context`).
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Jsonb>)]
    pub trace_context: Option<serde_json::Value>,
    /// When the job fell due (as enqueued, or as its last retry set it); with
    /// `id`, its place in the claim order.
    #[diesel(sql_type = diesel::sql_types::Timestamptz)]
    pub run_after: DateTime<Utc>,
    /// The job's concurrency key (`jobs.concurrency_key`): the claim took a
    /// slot of it, which this claim's end gives back.
    #[diesel(sql_type = Nullable<Text>)]
    pub concurrency_key: Option<String>,
    /// The parents that ended `failed` or `cancelled` for a job enqueued
    /// with policy [`DependencyPolicy::Run`](crate::outbox::DependencyPolicy::Run): it
    /// runs without their work. `None` for every other job.
    #[diesel(sql_type = Nullable<Array<BigInt>>)]
    pub unfinished_parents: Option<Vec<i64>>,
    /// Whether the job's end changes no other row: it has no ordering key,
    /// no concurrency key and, when claimed, no dependent. The worker pool
    /// writes such a job's `done` through the shorter finish
    /// ([`HotStatements::finish_standalone_first`](crate::statements::HotStatements::finish_standalone_first)),
    /// which checks all three again on the row.
    #[diesel(sql_type = Bool)]
    pub standalone: bool,
}

impl ClaimedJob {
    /// The job's place in the claim order, for [`claim_jobs_after`].
    pub fn position(&self) -> ClaimPosition {
        ClaimPosition {
            run_after: self.run_after,
            id: self.id,
        }
    }
}

/// A place in the claim order `(run_after, id)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClaimPosition {
    /// The job's `run_after`: jobs are claimed earliest due first.
    pub run_after: DateTime<Utc>,
    /// The job's id: among jobs due at the same moment, lowest first.
    pub id: i64,
}

/// Claims up to `request.limit` due jobs, oldest first. See `sql/claim_jobs.sql`.
///
/// A job is due when it is `pending`, its `run_after` has passed, it is
/// not waiting behind an earlier job of its ordering key nor for a parent, and its
/// concurrency key (if any) has room under its [`ConcurrencyLimit`](crate::outbox::ConcurrencyLimit). Each claimed job
/// becomes `processing` under a new fencing token and counts an attempt, in
/// one statement; rows another worker has locked are skipped, not waited
/// for, so concurrent claimers never take the same job and never block each
/// other. The claim commits on its own (unless `conn` is in a transaction)
/// without waiting for a WAL flush: a claim lost in a server crash leaves the
/// job pending, as if it had never been claimed.
pub fn claim_jobs(
    conn: &mut PgConnection,
    request: &ClaimRequest<'_>,
) -> QueryResult<Vec<ClaimedJob>> {
    claim(conn, request, None)
}

/// [`claim_jobs`], taking only keyless jobs that come after `after` in the
/// claim order (keyed jobs are claimed through their key, from its front):
/// a worker pool draining a backlog passes where its last claim ended, so it does
/// not walk again the index entries of the jobs it already took (which, while
/// an old snapshot pins the MVCC horizon, nothing can remove). Jobs that a
/// slow transaction committed behind `after` are not seen: claim from the front
/// with [`claim_jobs`] regularly.
pub fn claim_jobs_after(
    conn: &mut PgConnection,
    request: &ClaimRequest<'_>,
    after: ClaimPosition,
) -> QueryResult<Vec<ClaimedJob>> {
    claim(conn, request, Some(after))
}

fn claim(
    conn: &mut PgConnection,
    request: &ClaimRequest<'_>,
    after: Option<ClaimPosition>,
) -> QueryResult<Vec<ClaimedJob>> {
    if request.limit <= 0 || request.kinds.is_empty() {
        return Ok(Vec::new());
    }
    // One statement, its own transaction unless the caller opened one; it
    // commits without waiting for a WAL flush (see the SQL for why that is safe).
    diesel::sql_query(CLAIM_SQL)
        .bind::<BigInt, _>(request.limit)
        .bind::<Array<Text>, _>(request.kinds)
        .bind::<Text, _>(request.worker_id)
        .bind::<BigInt, _>(millis(request.lease))
        // The front of the order: every job comes after it.
        .bind::<Nullable<Timestamptz>, _>(after.map(|a| a.run_after))
        .bind::<BigInt, _>(after.map_or(0, |a| a.id))
        .load(conn)
}

/// The claim statement's text (`sql/claim_jobs.sql`): `$1` limit, `$2` kinds,
/// `$3` worker id, `$4` lease in milliseconds, `$5` / `$6` the cursor's
/// `run_after` and id (`NULL` and 0 for the front). For a benchmark that
/// prepares it on a connection of its own, as the worker pool does; Diesel's path
/// above runs the same text.
pub const CLAIM_SQL: &str = include_str!("sql/claim_jobs.sql");

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl ClaimedJob {
    /// A row of [`CLAIM_SQL`] run on tokio-postgres, in the claim's column
    /// order (`claim_jobs.sql`'s SELECT). For a benchmark running the claim
    /// prepared on a connection of its own, as the worker pool does.
    pub fn from_row(row: &tokio_postgres::Row) -> Result<ClaimedJob, tokio_postgres::Error> {
        Ok(ClaimedJob {
            id: row.try_get(0)?,
            kind: row.try_get(1)?,
            payload: row.try_get(2)?,
            attempt: row.try_get(3)?,
            max_attempts: row.try_get(4)?,
            lease_token: row.try_get(5)?,
            created_at: row.try_get(6)?,
            trace_context: row.try_get(7)?,
            run_after: row.try_get(8)?,
            concurrency_key: row.try_get(9)?,
            unfinished_parents: row.try_get(10)?,
            standalone: row.try_get(11)?,
        })
    }
}
