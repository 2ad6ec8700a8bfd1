//! Limits on a concurrency key ([`ConcurrencyLimit`]): how many of the key's jobs
//! may be processing, how fast they may be claimed, and a pause. Jobs name
//! their key with [`JobOptions::concurrency_key`](super::JobOptions::concurrency_key).

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Double, Integer, Nullable, Text, Timestamptz};

/// The limits of one concurrency key, enforced across every worker pool by the
/// claim. A key without limits (never set, or removed with
/// [`remove_concurrency_limit`]) is unlimited; so is each `None` here.
///
/// Jobs of a key at its limit are not claimed: they stay `pending`, for a
/// later claim by any worker pool once the key has room again.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ConcurrencyLimit {
    /// At most this many of the key's jobs `processing` at once (at least 1).
    pub max_in_flight: Option<i32>,
    /// At most this many claims of the key's jobs a second (above 0), as a
    /// token bucket that holds a tenth of a second's worth, and at least
    /// one: any one second sees at most `per_second` claims plus that
    /// burst.
    pub per_second: Option<f64>,
    /// No job of the key is claimed before this time. A far-future value
    /// ([`DateTime::<Utc>::MAX_UTC`], stored as the end of the year 9999)
    /// pauses the key until the limit is changed; jobs already processing
    /// run on.
    pub paused_until: Option<DateTime<Utc>>,
}

/// A [`ConcurrencyLimit`] refused, or the database failing.
#[derive(Debug, thiserror::Error)]
pub enum ConcurrencyLimitError {
    /// `max_in_flight` below 1.
    #[error("max_in_flight must be at least 1, got {0}")]
    MaxInFlight(i32),
    /// `per_second` not a positive, finite number.
    #[error("per_second must be a positive, finite number, got {0}")]
    PerSecond(f64),
    /// The statement failed.
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

impl ConcurrencyLimit {
    fn check(&self) -> Result<(), ConcurrencyLimitError> {
        if let Some(max) = self.max_in_flight.filter(|m| *m < 1) {
            return Err(ConcurrencyLimitError::MaxInFlight(max));
        }
        if let Some(rate) = self.per_second.filter(|r| !(r.is_finite() && *r > 0.0)) {
            return Err(ConcurrencyLimitError::PerSecond(rate));
        }
        Ok(())
    }
}

/// Sets (replaces) the limits of `key`, whether or not any job has used it
/// yet; claims from the next statement on obey them. Refuses a limit that
/// could never be met (`max_in_flight` below 1, a `per_second` not above 0)
/// and writes nothing then. See `sql/set_concurrency_limit.sql`.
pub fn set_concurrency_limit(
    conn: &mut PgConnection,
    key: &str,
    limit: &ConcurrencyLimit,
) -> Result<(), ConcurrencyLimitError> {
    limit.check()?;
    // PostgreSQL's timestamptz ends long before chrono's MAX_UTC: a pause
    // past it is a pause until changed.
    let paused_until = limit.paused_until.map(|at| at.min(far_future()));
    diesel::sql_query(include_str!("sql/set_concurrency_limit.sql"))
        .bind::<Text, _>(key)
        .bind::<Nullable<Integer>, _>(limit.max_in_flight)
        .bind::<Nullable<Double>, _>(limit.per_second)
        .bind::<Nullable<Timestamptz>, _>(paused_until)
        .execute(conn)?;
    Ok(())
}

/// Lifts every limit of `key`: its jobs run as if it had none. See
/// `sql/remove_concurrency_limit.sql`.
pub fn remove_concurrency_limit(conn: &mut PgConnection, key: &str) -> QueryResult<()> {
    diesel::sql_query(include_str!("sql/remove_concurrency_limit.sql"))
        .bind::<Text, _>(key)
        .execute(conn)
        .map(drop)
}

/// A key's limits and how many of its jobs are processing now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConcurrencyState {
    /// The key's limits (all `None`: unlimited).
    pub limit: ConcurrencyLimit,
    /// Its jobs in `processing`, as the queue counts them for `max_in_flight`.
    pub in_flight: i32,
}

/// The limits and in-flight count of `key`; `None` when no job ever used it
/// and it was never limited.
pub fn concurrency_state(
    conn: &mut PgConnection,
    key: &str,
) -> QueryResult<Option<ConcurrencyState>> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = Nullable<Integer>)]
        max_in_flight: Option<i32>,
        #[diesel(sql_type = Nullable<Double>)]
        per_second: Option<f64>,
        #[diesel(sql_type = Nullable<Timestamptz>)]
        paused_until: Option<DateTime<Utc>>,
        #[diesel(sql_type = Integer)]
        in_flight: i32,
    }
    let row: Option<Row> = diesel::sql_query(include_str!("sql/concurrency_state.sql"))
        .bind::<Text, _>(key)
        .get_result(conn)
        .optional()?;
    Ok(row.map(|r| ConcurrencyState {
        limit: ConcurrencyLimit {
            max_in_flight: r.max_in_flight,
            per_second: r.per_second,
            paused_until: r.paused_until,
        },
        in_flight: r.in_flight,
    }))
}

/// Ten thousand years from the epoch: later than any pause means, earlier
/// than PostgreSQL's last timestamp.
fn far_future() -> DateTime<Utc> {
    DateTime::from_timestamp(253_402_300_799, 0).unwrap_or(DateTime::<Utc>::MAX_UTC)
}
