//! `delivery_attempts`: the log of every delivery attempt, and what each
//! attempt says about its endpoint's health (`failing_since`).

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Double, Integer, Nullable, SmallInt, Text, Timestamptz};

use crate::orders::EndpointId;

/// Characters of an answer (or an error) kept in a row (the CHECK allows 1000).
pub const EXCERPT_CHARS: usize = 500;

/// One attempt, as the worker saw it.
#[derive(Debug, Clone)]
pub struct NewAttempt {
    pub job_id: i64,
    pub endpoint_id: EndpointId,
    pub attempt: i32,
    pub started_at: DateTime<Utc>,
    pub duration: Duration,
    pub status_code: Option<u16>,
    /// `ok`, `retryable` or `permanent`.
    pub outcome: &'static str,
    pub excerpt: Option<String>,
    /// A NATS publish's PubAck: the stream sequence of its message.
    pub stream_sequence: Option<i64>,
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

/// An endpoint's recent attempts: its last [`STATS_WINDOW`], as the
/// dashboard counts them.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct AttemptStats {
    pub attempts: i64,
    /// The share of them that succeeded (0 to 1); none without attempts.
    pub success_rate: Option<f64>,
    /// Their 95th percentile duration, in milliseconds.
    pub p95_ms: Option<f64>,
}

/// Attempts per endpoint that [`stats`] reads: bounded however busy it is.
pub const STATS_WINDOW: i64 = 1000;

#[derive(QueryableByName)]
struct StatsRow {
    #[diesel(sql_type = BigInt)]
    endpoint_id: i64,
    #[diesel(sql_type = BigInt)]
    attempts: i64,
    #[diesel(sql_type = BigInt)]
    ok: i64,
    #[diesel(sql_type = Nullable<Double>)]
    p95_ms: Option<f64>,
}

/// Each endpoint's [`AttemptStats`], by id (endpoints without attempts
/// are missing). Each reads its last [`STATS_WINDOW`] attempts through
/// `delivery_attempts_endpoint_idx`.
pub fn stats(conn: &mut PgConnection) -> QueryResult<HashMap<i64, AttemptStats>> {
    let rows: Vec<StatsRow> = diesel::sql_query(
        "SELECT e.id AS endpoint_id, count(r.*) AS attempts, \
                count(r.*) FILTER (WHERE r.outcome = 'ok') AS ok, \
                percentile_cont(0.95) WITHIN GROUP (ORDER BY r.duration_ms) AS p95_ms \
         FROM endpoints e \
         JOIN LATERAL ( \
             SELECT a.outcome, a.duration_ms FROM delivery_attempts a \
             WHERE a.endpoint_id = e.id \
             ORDER BY a.started_at DESC, a.id DESC LIMIT $1 \
         ) r ON true \
         GROUP BY e.id",
    )
    .bind::<BigInt, _>(STATS_WINDOW)
    .load(conn)?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let stats = AttemptStats {
                attempts: r.attempts,
                #[expect(clippy::cast_precision_loss, reason = "at most STATS_WINDOW")]
                success_rate: (r.attempts > 0).then(|| r.ok as f64 / r.attempts as f64),
                p95_ms: r.p95_ms,
            };
            (r.endpoint_id, stats)
        })
        .collect())
}

/// Deletes the attempts that started more than `older_than` ago, in batches
/// of `batch` rows (short transactions); returns how many went.
pub fn prune(conn: &mut PgConnection, older_than: Duration, batch: i64) -> QueryResult<u64> {
    crate::db::AgedTable {
        table: "delivery_attempts",
        key: "id",
        time: "started_at",
        keep_while: None,
    }
    .prune(conn, older_than, batch)
}
