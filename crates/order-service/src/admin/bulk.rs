//! The bulk actions' writes (retry or cancel every job a filter matches): a
//! preview of how many, then batches of [`ACTION_BATCH`], each one short
//! transaction that locks its rows and changes them through the outbox's own
//! functions. The statements are in `sql/`.

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Text};
use serde::Serialize;

use super::queries::{read, set_local_timeouts};
use crate::job_list::{self, JobFilter, with_job_filter};
use crate::outbox::{self, RetrySelection};

/// Rows a bulk action changes per transaction.
pub(super) const ACTION_BATCH: i64 = 500;
/// A preview counts at most this many jobs ("more than 100,000").
pub(super) const PREVIEW_LIMIT: i64 = 100_000;

/// What a bulk action applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Action {
    Retry,
    Cancel,
}

impl Action {
    pub fn parse(raw: &str) -> Option<Action> {
        match raw {
            "retry" => Some(Action::Retry),
            "cancel" => Some(Action::Cancel),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Retry => "retry",
            Action::Cancel => "cancel",
        }
    }
    /// The statuses the action changes: only failed jobs are retried; only
    /// jobs that have not finished (pending, failed) are cancelled.
    pub fn statuses(self) -> &'static [&'static str] {
        match self {
            Action::Retry => &["failed"],
            Action::Cancel => &["pending", "failed"],
        }
    }
}

#[derive(Debug, QueryableByName)]
pub(super) struct Count {
    #[diesel(sql_type = BigInt)]
    pub n: i64,
}

/// The preview of a bulk action: how many jobs it would change (counting at
/// most `PREVIEW_LIMIT + 1`), and the newest id it will consider.
pub(super) fn preview(
    conn: &mut PgConnection,
    timeout: Duration,
    action: Action,
    filter: &JobFilter,
) -> QueryResult<(i64, i64)> {
    read(conn, timeout, |conn| {
        let max_id = job_list::newest_job_id(conn)?;
        let query = diesel::sql_query(with_job_filter(include_str!(
            "sql/count_action_targets.sql"
        )))
        .into_boxed()
        .bind::<Array<Text>, _>(action.statuses())
        .bind::<BigInt, _>(max_id);
        let count: Count = filter
            .bind(query)
            .bind::<BigInt, _>(PREVIEW_LIMIT + 1)
            .get_result(conn)?;
        Ok((count.n, max_id))
    })
}

/// Runs a bulk action in batches of `ACTION_BATCH`, one short transaction
/// each, over jobs with id at most `max_id` (so jobs that fail after the
/// preview are not swept in).
/// Returns how many jobs changed, or the error with how many changed before it.
pub(super) fn run_bulk(
    conn: &mut PgConnection,
    timeout: Duration,
    action: Action,
    filter: &JobFilter,
    max_id: i64,
) -> Result<i64, (i64, diesel::result::Error)> {
    #[derive(QueryableByName)]
    struct Id {
        #[diesel(sql_type = BigInt)]
        id: i64,
    }
    let mut after = 0_i64;
    let mut changed = 0_i64;
    loop {
        let batch = conn.transaction(|conn| {
            set_local_timeouts(conn, timeout)?;
            let query =
                diesel::sql_query(with_job_filter(include_str!("sql/lock_action_batch.sql")))
                    .into_boxed()
                    .bind::<Array<Text>, _>(action.statuses())
                    .bind::<BigInt, _>(max_id);
            let ids: Vec<Id> = filter
                .bind(query)
                .bind::<BigInt, _>(after)
                .bind::<BigInt, _>(ACTION_BATCH)
                .load(conn)?;
            let ids: Vec<i64> = ids.into_iter().map(|r| r.id).collect();
            let last = ids.last().copied();
            let done = apply(conn, action, &ids)?;
            Ok::<_, diesel::result::Error>((last, ids.len() as i64, done))
        });
        match batch {
            Ok((last, seen, done)) => {
                changed += done;
                match last {
                    Some(last) if seen == ACTION_BATCH => after = last,
                    _ => return Ok(changed),
                }
            }
            Err(error) => return Err((changed, error)),
        }
    }
}

/// Applies `action` to `ids`, already locked by the caller's transaction (so
/// their status cannot have moved), through the outbox's own functions.
pub(super) fn apply(conn: &mut PgConnection, action: Action, ids: &[i64]) -> QueryResult<i64> {
    if ids.is_empty() {
        return Ok(0);
    }
    match action {
        Action::Retry => {
            let report = outbox::retry_failed_jobs(conn, &RetrySelection::Ids(ids.to_vec()))?;
            Ok(report.retried.len() as i64)
        }
        Action::Cancel => Ok(outbox::cancel_job_batch(conn, ids)?.len() as i64),
    }
}
