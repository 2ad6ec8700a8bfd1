//! Read-outs for operators and gauges: counts by kind and status, the oldest due job.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Double, Nullable, Text};
use serde::Serialize;

use super::JobStatus;

/// One kind's counts.
#[derive(Debug, Clone, QueryableByName, Serialize, PartialEq)]
pub struct KindStats {
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = BigInt)]
    pub pending: i64,
    #[diesel(sql_type = BigInt)]
    pub processing: i64,
    #[diesel(sql_type = BigInt)]
    pub done: i64,
    #[diesel(sql_type = BigInt)]
    pub failed: i64,
    #[diesel(sql_type = BigInt)]
    pub cancelled: i64,
    #[diesel(sql_type = BigInt)]
    pub expired_leases: i64,
    #[diesel(sql_type = Nullable<Double>)]
    pub oldest_due_pending_seconds: Option<f64>,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct QueueStats {
    pub kinds: Vec<KindStats>,
}

impl QueueStats {
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
    pub fn expired_leases(&self) -> i64 {
        self.kinds.iter().map(|k| k.expired_leases).sum()
    }
    pub fn oldest_due_pending_seconds(&self) -> Option<f64> {
        self.kinds
            .iter()
            .filter_map(|k| k.oldest_due_pending_seconds)
            .reduce(f64::max)
    }
}

pub fn queue_stats(conn: &mut PgConnection) -> QueryResult<QueueStats> {
    let kinds = diesel::sql_query(include_str!("sql/queue_stats.sql")).load(conn)?;
    Ok(QueueStats { kinds })
}

/// How many jobs are in each status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, QueryableByName, Serialize)]
pub struct QueueDepth {
    #[diesel(sql_type = BigInt)]
    pub pending: i64,
    #[diesel(sql_type = BigInt)]
    pub processing: i64,
    #[diesel(sql_type = BigInt)]
    pub done: i64,
    #[diesel(sql_type = BigInt)]
    pub failed: i64,
    #[diesel(sql_type = BigInt)]
    pub cancelled: i64,
}

impl QueueDepth {
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
