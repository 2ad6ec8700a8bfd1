//! The operator's list of jobs, and the filter that says which jobs an
//! operator means. `jobs list` and the dashboard's jobs page read one
//! statement (`sql/list_jobs.sql`), and the dashboard's bulk actions count
//! and lock with the same filter (`sql/job_filter.sql`), so what a page
//! shows is what an action changes.

use std::ops::Range;

use chrono::{DateTime, Utc};
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{BigInt, Bool, Nullable, Text, Timestamptz};
use serde::Serialize;

use outbox_core::outbox::JobStatus;

use crate::orders::OrderId;
use crate::schema::jobs_all;

/// A job as operators see it, wherever it lives (selectable from `jobs_all`,
/// and a row of `sql/list_jobs.sql`).
#[derive(Debug, Clone, Queryable, QueryableByName, Selectable, Serialize)]
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

/// Which jobs an operator means: every field that is set must match; the
/// default matches every job.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobFilter {
    pub status: Option<JobStatus>,
    pub kind: Option<String>,
    pub order_id: Option<i64>,
    /// Text the job's last error contains, taken literally
    /// ([`JobFilter::error_pattern`] is what SQL matches).
    pub error: Option<String>,
    /// Created at or after.
    pub from: Option<DateTime<Utc>>,
    /// Created before.
    pub to: Option<DateTime<Utc>>,
}

/// The filter's conditions, written into a statement where it says
/// `{job_filter}` (see [`with_job_filter`]).
const JOB_FILTER: &str = include_str!("sql/job_filter.sql");

/// `statement` with the jobs filter's conditions where it says `{job_filter}`;
/// the statement then takes the filter's binds as `$3..$8` ([`JobFilter::bind`]).
pub(crate) fn with_job_filter(statement: &str) -> String {
    statement.replace("{job_filter}", &format!("(\n{JOB_FILTER})"))
}

impl JobFilter {
    /// `%text%` for ILIKE, with the operator's `%`, `_` and `\` taken literally.
    pub fn error_pattern(&self) -> Option<String> {
        self.error.as_ref().map(|e| {
            let escaped = e
                .replace('\\', "\\\\")
                .replace('%', "\\%")
                .replace('_', "\\_");
            format!("%{escaped}%")
        })
    }

    /// Whether an index holds only matching rows, so a walk by id needs no
    /// window (see `sql/list_jobs.sql`).
    pub fn narrowed_by_index(&self) -> bool {
        self.order_id.is_some()
            || matches!(
                self.status,
                Some(JobStatus::Failed) | Some(JobStatus::Processing)
            )
    }

    /// `query` with this filter's six parameters bound next, in the order
    /// `sql/job_filter.sql` takes them: status, kind, order id, error
    /// pattern, created from, created before.
    pub(crate) fn bind<'f>(
        &'f self,
        query: BoxedSqlQuery<'f, Pg, SqlQuery>,
    ) -> BoxedSqlQuery<'f, Pg, SqlQuery> {
        query
            .bind::<Nullable<Text>, _>(self.status.map(JobStatus::as_str))
            .bind::<Nullable<Text>, _>(self.kind.as_deref())
            .bind::<Nullable<BigInt>, _>(self.order_id)
            .bind::<Nullable<Text>, _>(self.error_pattern())
            .bind::<Nullable<Timestamptz>, _>(self.from)
            .bind::<Nullable<Timestamptz>, _>(self.to)
    }
}

/// The newest job id, live or archived (`sql/newest_job_id.sql`).
pub(crate) fn newest_job_id(conn: &mut PgConnection) -> QueryResult<i64> {
    #[derive(QueryableByName)]
    struct Newest {
        #[diesel(sql_type = BigInt)]
        id: i64,
    }
    let newest: Newest =
        diesel::sql_query(include_str!("sql/newest_job_id.sql")).get_result(conn)?;
    Ok(newest.id)
}

/// Up to `limit` jobs matching `filter` with ids in `ids`, newest first
/// (`sql/list_jobs.sql`); `hide_payload` leaves every payload out (NULL).
pub(crate) fn page<Row>(
    conn: &mut PgConnection,
    filter: &JobFilter,
    ids: Range<i64>,
    limit: i64,
    hide_payload: bool,
) -> QueryResult<Vec<Row>>
where
    Row: QueryableByName<Pg> + 'static,
{
    let query = diesel::sql_query(with_job_filter(include_str!("sql/list_jobs.sql")))
        .into_boxed()
        .bind::<BigInt, _>(ids.end)
        .bind::<BigInt, _>(ids.start);
    filter
        .bind(query)
        .bind::<BigInt, _>(limit)
        .bind::<Bool, _>(hide_payload)
        .load(conn)
}

/// Ids the first window of `list_jobs` spans; each next one is four times wider.
const FIRST_LIST_WINDOW: i64 = 10_000;

/// Up to `limit` jobs matching `filter`, newest first.
///
/// With a filter an index narrows (an order, or status failed or processing),
/// one walk over every id. Otherwise newest ids first in widening windows, so
/// that a page of the newest jobs reads the newest ids of each partition
/// (through its BRIN index on id) rather than sorting the whole history.
pub fn list_jobs(
    conn: &mut PgConnection,
    filter: &JobFilter,
    limit: i64,
) -> QueryResult<Vec<JobRow>> {
    let limit = limit.max(1);
    let mut upper = newest_job_id(conn)?.saturating_add(1);
    if filter.narrowed_by_index() {
        return page(conn, filter, 0..upper, limit, true);
    }
    let mut rows: Vec<JobRow> = Vec::new();
    let mut span = FIRST_LIST_WINDOW;
    while (rows.len() as i64) < limit && upper > 0 {
        let lower = upper.saturating_sub(span).max(0);
        let wanted = limit - rows.len() as i64;
        rows.extend(page::<JobRow>(conn, filter, lower..upper, wanted, true)?);
        upper = lower;
        span = span.saturating_mul(4);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_of_the_filter_gets_its_conditions() {
        for statement in [
            include_str!("sql/list_jobs.sql"),
            include_str!("admin/sql/count_action_targets.sql"),
            include_str!("admin/sql/lock_action_batch.sql"),
        ] {
            assert!(statement.contains("{job_filter}"));
            let written = with_job_filter(statement);
            assert!(!written.contains("{job_filter}"));
            assert!(written.contains("last_error ILIKE $6"));
        }
    }

    #[test]
    fn error_text_is_matched_literally() {
        let filter = JobFilter {
            error: Some("50%_off\\".into()),
            ..Default::default()
        };
        assert_eq!(filter.error_pattern().as_deref(), Some("%50\\%\\_off\\\\%"));
    }
}
