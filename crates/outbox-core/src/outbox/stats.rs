//! Read-outs for operators and gauges: counts by kind and status, the oldest due job.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Double, Nullable, Text};
use serde::Serialize;

use super::JobStatus;

/// One kind's counts, exact, over every job of the kind (live and archived),
/// as of one snapshot.
#[derive(Debug, Clone, QueryableByName, Serialize, PartialEq)]
pub struct KindStats {
    /// The job kind these counts are for.
    #[diesel(sql_type = Text)]
    pub kind: String,
    /// Jobs `pending`: due, scheduled for later, or waiting behind their
    /// ordering key.
    #[diesel(sql_type = BigInt)]
    pub pending: i64,
    /// Jobs `processing`: claimed, their leases expired or not.
    #[diesel(sql_type = BigInt)]
    pub processing: i64,
    /// Jobs `done`, in the archive until pruned.
    #[diesel(sql_type = BigInt)]
    pub done: i64,
    /// Jobs `failed`, waiting for an operator.
    #[diesel(sql_type = BigInt)]
    pub failed: i64,
    /// Jobs `cancelled`.
    #[diesel(sql_type = BigInt)]
    pub cancelled: i64,
    /// `processing` jobs whose lease has run out and that the reaper has not
    /// taken back yet: a dead or stuck worker's.
    #[diesel(sql_type = BigInt)]
    pub expired_leases: i64,
    /// Seconds since the oldest due pending job fell due (`now() -
    /// run_after`), not counting jobs blocked behind their ordering key;
    /// `None` when no pending job is due. How far the worker pools lag.
    #[diesel(sql_type = Nullable<Double>)]
    pub oldest_due_pending_seconds: Option<f64>,
}

/// Counts by kind and status ([`queue_stats`]).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct QueueStats {
    /// One entry per kind that has any job, sorted by kind.
    pub kinds: Vec<KindStats>,
}

impl QueueStats {
    /// Jobs in `status`, all kinds together.
    pub fn count(&self, status: JobStatus) -> i64 {
        self.kinds
            .iter()
            .map(|k| match status {
                JobStatus::Pending => k.pending,
                JobStatus::Processing => k.processing,
                JobStatus::Done => k.done,
                JobStatus::Failed => k.failed,
                JobStatus::Cancelled => k.cancelled,
            })
            .sum()
    }
    /// Expired leases not yet reaped, all kinds together.
    pub fn expired_leases(&self) -> i64 {
        self.kinds.iter().map(|k| k.expired_leases).sum()
    }
    /// The largest [`KindStats::oldest_due_pending_seconds`] of any kind:
    /// how long the oldest due job has waited; `None` when none is due.
    pub fn oldest_due_pending_seconds(&self) -> Option<f64> {
        self.kinds
            .iter()
            .filter_map(|k| k.oldest_due_pending_seconds)
            .reduce(f64::max)
    }
}

/// Counts every job by kind and status, exactly. Reads every row of `jobs`
/// and of the archive (`jobs_all`), so its cost grows with the history kept:
/// for operators (`jobs stats`), not for a gauge refreshed every few seconds
/// (use [`queue_depth`]). Read-only. See `sql/queue_stats.sql`.
pub fn queue_stats(conn: &mut PgConnection) -> QueryResult<QueueStats> {
    let kinds = diesel::sql_query(include_str!("sql/queue_stats.sql")).load(conn)?;
    Ok(QueueStats { kinds })
}

/// How many jobs are in each status, all kinds together ([`queue_depth`]).
/// Exact except `done`, which is an estimate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, QueryableByName, Serialize)]
pub struct QueueDepth {
    /// Jobs `pending` (blocked behind their ordering key included), exact.
    #[diesel(sql_type = BigInt)]
    pub pending: i64,
    /// Jobs `processing`, exact.
    #[diesel(sql_type = BigInt)]
    pub processing: i64,
    /// Jobs `done`: PostgreSQL's live-row estimate of the archive's
    /// partitions, which trails commits by a second or so and, after a
    /// server crash, restarts from what the next VACUUM or ANALYZE finds.
    #[diesel(sql_type = BigInt)]
    pub done: i64,
    /// Jobs `failed`, exact.
    #[diesel(sql_type = BigInt)]
    pub failed: i64,
    /// Jobs `cancelled`, exact.
    #[diesel(sql_type = BigInt)]
    pub cancelled: i64,
}

impl QueueDepth {
    /// The count of `status`.
    pub fn count(&self, status: JobStatus) -> i64 {
        match status {
            JobStatus::Pending => self.pending,
            JobStatus::Processing => self.processing,
            JobStatus::Done => self.done,
            JobStatus::Failed => self.failed,
            JobStatus::Cancelled => self.cancelled,
        }
    }
}

/// Jobs by status, cheaply enough to refresh every few seconds for a gauge.
/// See `sql/queue_depth.sql`.
pub fn queue_depth(conn: &mut PgConnection) -> QueryResult<QueueDepth> {
    diesel::sql_query(include_str!("sql/queue_depth.sql")).get_result(conn)
}
