//! `source_reconciliations`: where each source's reconciliation got to (its
//! watermark) and what its last run did, for the next run and the
//! dashboard. One row per source, written by whichever run finishes last.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::upsert::excluded;
use serde::Serialize;

use crate::schema::{source_reconciliations, sources};

/// The counts of a run, as stored.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunCounts {
    pub fetched: i32,
    pub recovered: i32,
    pub already: i32,
    pub pages: i32,
}

/// The source's watermark: a run asks for events created from it on.
pub fn watermark(conn: &mut PgConnection, source_id: i64) -> QueryResult<Option<DateTime<Utc>>> {
    Ok(source_reconciliations::table
        .find(source_id)
        .select(source_reconciliations::watermark)
        .first::<Option<DateTime<Utc>>>(conn)
        .optional()?
        .flatten())
}

/// A run of the source starts now.
pub fn started(conn: &mut PgConnection, source_id: i64) -> QueryResult<()> {
    diesel::insert_into(source_reconciliations::table)
        .values((
            source_reconciliations::source_id.eq(source_id),
            source_reconciliations::started_at.eq(diesel::dsl::now),
        ))
        .on_conflict(source_reconciliations::source_id)
        .do_update()
        .set((
            source_reconciliations::started_at.eq(diesel::dsl::now),
            source_reconciliations::finished_at.eq(None::<DateTime<Utc>>),
        ))
        .execute(conn)
        .map(drop)
}

/// A run finished: its counts, no error, and the watermark moved up to
/// `watermark` (never back: a run started earlier may finish later).
pub fn succeeded(
    conn: &mut PgConnection,
    source_id: i64,
    counts: &RunCounts,
    watermark: Option<DateTime<Utc>>,
) -> QueryResult<()> {
    use diesel::dsl::sql;
    use diesel::sql_types::{Nullable, Timestamptz};
    let raised = sql::<Nullable<Timestamptz>>("GREATEST(source_reconciliations.watermark, ")
        .bind::<Nullable<Timestamptz>, _>(watermark)
        .sql(")");
    diesel::insert_into(source_reconciliations::table)
        .values((
            source_reconciliations::source_id.eq(source_id),
            source_reconciliations::started_at.eq(diesel::dsl::now),
            source_reconciliations::watermark.eq(watermark),
        ))
        .on_conflict(source_reconciliations::source_id)
        .do_update()
        .set((
            source_reconciliations::finished_at.eq(diesel::dsl::now),
            source_reconciliations::watermark.eq(raised),
            source_reconciliations::fetched.eq(counts.fetched),
            source_reconciliations::recovered.eq(counts.recovered),
            source_reconciliations::already.eq(counts.already),
            source_reconciliations::pages.eq(counts.pages),
            source_reconciliations::last_error.eq(None::<String>),
            source_reconciliations::last_error_at.eq(None::<DateTime<Utc>>),
        ))
        .execute(conn)
        .map(drop)
}

/// A run failed: what it did before, and why; the watermark stays.
pub fn failed(
    conn: &mut PgConnection,
    source_id: i64,
    counts: &RunCounts,
    error: &str,
) -> QueryResult<()> {
    let error = crate::text::one_line(error, 500);
    diesel::insert_into(source_reconciliations::table)
        .values((
            source_reconciliations::source_id.eq(source_id),
            source_reconciliations::started_at.eq(diesel::dsl::now),
            source_reconciliations::last_error.eq(&error),
            source_reconciliations::last_error_at.eq(diesel::dsl::now),
        ))
        .on_conflict(source_reconciliations::source_id)
        .do_update()
        .set((
            source_reconciliations::finished_at.eq(diesel::dsl::now),
            source_reconciliations::fetched.eq(counts.fetched),
            source_reconciliations::recovered.eq(counts.recovered),
            source_reconciliations::already.eq(counts.already),
            source_reconciliations::pages.eq(counts.pages),
            source_reconciliations::last_error.eq(excluded(source_reconciliations::last_error)),
            source_reconciliations::last_error_at.eq(diesel::dsl::now),
        ))
        .execute(conn)
        .map(drop)
}

/// A reconciled source as the dashboard shows it.
#[derive(Debug, Clone, Queryable, Serialize)]
pub struct SourceReconciliation {
    pub source: String,
    pub has_api_key: bool,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub watermark: Option<DateTime<Utc>>,
    pub fetched: Option<i32>,
    pub recovered: Option<i32>,
    pub already: Option<i32>,
    pub last_error: Option<String>,
    pub last_error_at: Option<DateTime<Utc>>,
}

/// Every `stripe` source, with its last run if it had one, by name.
pub fn list(conn: &mut PgConnection) -> QueryResult<Vec<SourceReconciliation>> {
    sources::table
        .left_join(source_reconciliations::table)
        .filter(sources::kind.eq("stripe"))
        .order(sources::name)
        .select((
            sources::name,
            sources::api_key.is_not_null(),
            source_reconciliations::started_at.nullable(),
            source_reconciliations::finished_at.nullable(),
            source_reconciliations::watermark.nullable(),
            source_reconciliations::fetched.nullable(),
            source_reconciliations::recovered.nullable(),
            source_reconciliations::already.nullable(),
            source_reconciliations::last_error.nullable(),
            source_reconciliations::last_error_at.nullable(),
        ))
        .load(conn)
}
