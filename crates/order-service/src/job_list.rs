//! The operator's list of jobs (`jobs list`): newest first, filtered by
//! status, kind or order, wherever the jobs live.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::BigInt;
use serde::Serialize;

use outbox_core::outbox::JobStatus;

use crate::orders::OrderId;
use crate::schema::{jobs, jobs_all};

/// A job as operators see it, wherever it lives (selectable from `jobs_all`;
/// `list_jobs` also reads the same columns from `jobs`).
#[derive(Debug, Clone, Queryable, Selectable, Serialize)]
#[diesel(table_name = jobs_all)]
pub struct JobRow {
    pub id: i64,
    pub order_id: Option<OrderId>,
    pub kind: String,
    pub status: String,
    pub attempts: i32,
    pub max_attempts: i32,
    pub run_after: DateTime<Utc>,
    pub locked_by: Option<String>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    /// The parents the job still waits for (empty when none).
    pub waiting_on: Vec<i64>,
}

/// `JobRow`'s columns of `jobs` or of `jobs_all`, which has the same ones.
macro_rules! job_row_columns {
    ($table:ident) => {
        (
            $table::id,
            $table::order_id,
            $table::kind,
            $table::status,
            $table::attempts,
            $table::max_attempts,
            $table::run_after,
            $table::locked_by,
            $table::lease_expires_at,
            $table::created_at,
            $table::finished_at,
            $table::last_error,
            $table::waiting_on,
        )
    };
}

#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub status: Option<JobStatus>,
    pub kind: Option<String>,
    pub order_id: Option<i64>,
    pub limit: i64,
}

/// Ids the first window of `list_jobs` spans; each next one is four times wider.
const FIRST_LIST_WINDOW: i64 = 10_000;

/// Newest first.
///
/// A status other than done is read from `jobs` alone, where those jobs live.
/// Otherwise the archive is read too (`jobs_all`): by order id through its
/// indexes, or else newest ids first in widening windows of ids, so that a
/// page of the newest jobs reads the newest ids of each partition (through its
/// BRIN index on id) rather than sorting the whole history.
pub fn list_jobs(conn: &mut PgConnection, filter: &JobFilter) -> QueryResult<Vec<JobRow>> {
    let limit = filter.limit.max(1);
    if filter.status.is_some_and(|s| s != JobStatus::Done) {
        let mut query = jobs::table
            .select(job_row_columns!(jobs))
            .order(jobs::id.desc())
            .limit(limit)
            .into_boxed();
        if let Some(status) = filter.status {
            query = query.filter(jobs::status.eq(status.as_str()));
        }
        if let Some(kind) = &filter.kind {
            query = query.filter(jobs::kind.eq(kind.clone()));
        }
        if let Some(order_id) = filter.order_id {
            query = query.filter(jobs::order_id.eq(order_id));
        }
        return query.load(conn);
    }
    let everywhere = |lower: Option<i64>, upper: Option<i64>, limit: i64| {
        let mut query = jobs_all::table
            .select(job_row_columns!(jobs_all))
            .order(jobs_all::id.desc())
            .limit(limit)
            .into_boxed();
        if let Some(status) = filter.status {
            query = query.filter(jobs_all::status.eq(status.as_str()));
        }
        if let Some(kind) = &filter.kind {
            query = query.filter(jobs_all::kind.eq(kind.clone()));
        }
        if let Some(order_id) = filter.order_id {
            query = query.filter(jobs_all::order_id.eq(order_id));
        }
        if let Some(lower) = lower {
            query = query.filter(jobs_all::id.ge(lower));
        }
        if let Some(upper) = upper {
            query = query.filter(jobs_all::id.lt(upper));
        }
        query
    };
    if filter.order_id.is_some() {
        return everywhere(None, None, limit).load(conn);
    }
    #[derive(QueryableByName)]
    struct Newest {
        #[diesel(sql_type = BigInt)]
        id: i64,
    }
    let newest: Newest =
        diesel::sql_query(include_str!("sql/newest_job_id.sql")).get_result(conn)?;
    let mut rows: Vec<JobRow> = Vec::new();
    let mut upper = newest.id.saturating_add(1);
    let mut span = FIRST_LIST_WINDOW;
    while (rows.len() as i64) < limit && upper > 0 {
        let lower = upper.saturating_sub(span).max(0);
        let wanted = limit - rows.len() as i64;
        rows.extend(everywhere(Some(lower), Some(upper), wanted).load(conn)?);
        upper = lower;
        span = span.saturating_mul(4);
    }
    Ok(rows)
}
