//! Claiming due jobs: the `FOR UPDATE SKIP LOCKED` CTE.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Integer, Text};

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
    #[diesel(sql_type = diesel::sql_types::Nullable<BigInt>)]
    pub order_id: Option<i64>,
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
}

/// Claims up to `request.limit` due jobs. See `sql/claim_jobs.sql`.
pub fn claim_jobs(
    conn: &mut PgConnection,
    request: &ClaimRequest<'_>,
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
        .load(conn)
}

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
