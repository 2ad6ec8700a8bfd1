//! `delivery_attempts`: the log of every delivery attempt, and what each
//! attempt says about its endpoint's health (`failing_since`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Integer, Nullable, SmallInt, Text, Timestamptz};

/// Characters of an answer (or an error) kept in a row (the CHECK allows 1000).
pub const EXCERPT_CHARS: usize = 500;

/// One attempt, as the worker saw it.
#[derive(Debug, Clone)]
pub struct NewAttempt {
    pub job_id: i64,
    pub endpoint_id: i64,
    pub attempt: i32,
    pub started_at: DateTime<Utc>,
    pub duration: Duration,
    pub status_code: Option<u16>,
    /// `ok`, `retryable` or `permanent`.
    pub outcome: &'static str,
    pub excerpt: Option<String>,
}

/// An endpoint's health after an attempt.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct Health {
    /// Since when every attempt has failed; none after a success.
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub failing_since: Option<DateTime<Utc>>,
    /// Whether this attempt began or ended a failing streak.
    #[diesel(sql_type = Bool)]
    pub changed: bool,
}

/// Writes the attempt and moves the endpoint's `failing_since` in one
/// statement: set when the first failure of a streak ends, cleared by a
/// success. From the failure's end, not its start: a call that hung for its
/// whole timeout beside successful ones has not shown the endpoint failing
/// for that long. `None` when the endpoint is gone.
pub fn record(conn: &mut PgConnection, attempt: &NewAttempt) -> QueryResult<Option<Health>> {
    let excerpt = attempt
        .excerpt
        .as_deref()
        .map(|e| crate::text::one_line(e, EXCERPT_CHARS));
    let duration_ms = i32::try_from(attempt.duration.as_millis()).unwrap_or(i32::MAX);
    let rows: Vec<Health> = diesel::sql_query(
        "WITH logged AS ( \
             INSERT INTO delivery_attempts \
               (job_id, endpoint_id, attempt, started_at, duration_ms, status_code, outcome, excerpt) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         ), health AS ( \
             UPDATE endpoints \
             SET failing_since = CASE WHEN $7 = 'ok' THEN NULL \
                 ELSE coalesce(failing_since, $4 + $5 * interval '1 millisecond') END \
             WHERE id = $2 AND (failing_since IS NULL) <> ($7 = 'ok') \
             RETURNING failing_since \
         ) \
         SELECT failing_since, true AS changed FROM health \
         UNION ALL \
         SELECT failing_since, false FROM endpoints \
         WHERE id = $2 AND NOT EXISTS (SELECT 1 FROM health)",
    )
    .bind::<BigInt, _>(attempt.job_id)
    .bind::<BigInt, _>(attempt.endpoint_id)
    .bind::<Integer, _>(attempt.attempt)
    .bind::<Timestamptz, _>(attempt.started_at)
    .bind::<Integer, _>(duration_ms)
    .bind::<Nullable<SmallInt>, _>(attempt.status_code.and_then(|s| i16::try_from(s).ok()))
    .bind::<Text, _>(attempt.outcome)
    .bind::<Nullable<Text>, _>(excerpt)
    .load(conn)?;
    Ok(rows.into_iter().next())
}

/// Deletes the attempts that started more than `older_than` ago, in batches
/// of `batch` rows (short transactions); returns how many went.
pub fn prune(conn: &mut PgConnection, older_than: Duration, batch: i64) -> QueryResult<u64> {
    let cutoff = chrono::Duration::from_std(older_than)
        .ok()
        .and_then(|age| Utc::now().checked_sub_signed(age))
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    let mut total = 0u64;
    loop {
        let deleted = diesel::sql_query(
            "DELETE FROM delivery_attempts WHERE id IN ( \
                 SELECT id FROM delivery_attempts WHERE started_at < $1 LIMIT $2)",
        )
        .bind::<Timestamptz, _>(cutoff)
        .bind::<BigInt, _>(batch.max(1))
        .execute(conn)?;
        total += deleted as u64;
        if (deleted as i64) < batch.max(1) {
            return Ok(total);
        }
    }
}
