//! Claiming due jobs: the `FOR UPDATE SKIP LOCKED` CTE.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Integer, Nullable, Text, Timestamptz};

/// What a relay asks for.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// `locked_by` for the claimed jobs.
    pub worker_id: &'a str,
    /// Only jobs of these kinds are claimed.
    pub kinds: &'a [String],
    /// Most jobs to claim; a relay passes its free slots, never more.
    pub limit: i64,
    pub lease: Duration,
}

/// A job this worker now owns until `lease` runs out.
#[derive(Debug, Clone, QueryableByName)]
pub struct ClaimedJob {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = diesel::sql_types::Jsonb)]
    pub payload: serde_json::Value,
    /// This claim's attempt number (1 for the first run).
    #[diesel(sql_type = Integer, column_name = attempts)]
    pub attempt: i32,
    #[diesel(sql_type = Integer)]
    pub max_attempts: i32,
    /// The fencing token of this claim, unique across all claims ever made:
    /// every later write of this attempt (heartbeat, finish, release) presents it.
    #[diesel(sql_type = BigInt)]
    pub lease_token: i64,
    #[diesel(sql_type = diesel::sql_types::Timestamptz)]
    pub created_at: DateTime<Utc>,
    /// The trace context of whoever enqueued the job (`jobs.trace_context`).
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Jsonb>)]
    pub trace_context: Option<serde_json::Value>,
    /// When the job fell due; with `id`, its place in the claim order.
    #[diesel(sql_type = diesel::sql_types::Timestamptz)]
    pub run_after: DateTime<Utc>,
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
    pub run_after: DateTime<Utc>,
    pub id: i64,
}

/// Claims up to `request.limit` due jobs, oldest first. See `sql/claim_jobs.sql`.
pub fn claim_jobs(
    conn: &mut PgConnection,
    request: &ClaimRequest<'_>,
) -> QueryResult<Vec<ClaimedJob>> {
    claim(conn, request, None)
}

/// [`claim_jobs`], taking only jobs that come after `after` in the claim order:
/// a relay draining a backlog passes where its last claim ended, so it does
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
    diesel::sql_query(include_str!("sql/claim_jobs.sql"))
        .bind::<BigInt, _>(request.limit)
        .bind::<Array<Text>, _>(request.kinds)
        .bind::<Text, _>(request.worker_id)
        .bind::<BigInt, _>(millis(request.lease))
        // The front of the order: every job comes after it.
        .bind::<Nullable<Timestamptz>, _>(after.map(|a| a.run_after))
        .bind::<BigInt, _>(after.map_or(0, |a| a.id))
        .load(conn)
}

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
