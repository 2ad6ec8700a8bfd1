//! Ordering keys held up by a failed head job (`jobs blocked`).

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Integer, Nullable, Text, Timestamptz};
use serde::Serialize;

/// A key whose head job failed: nothing behind it runs until the head is
/// retried and succeeds, or is cancelled.
#[derive(Debug, Clone, PartialEq, QueryableByName, Serialize)]
pub struct BlockedKey {
    /// The key held up.
    #[diesel(sql_type = Text)]
    pub ordering_key: String,
    /// The failed head job.
    #[diesel(sql_type = BigInt, column_name = id)]
    pub job_id: i64,
    /// The head job's kind.
    #[diesel(sql_type = Text)]
    pub kind: String,
    /// The head job's arguments.
    #[diesel(sql_type = diesel::sql_types::Jsonb)]
    pub payload: serde_json::Value,
    /// Attempts the head job made before it failed.
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
    /// The head job's `max_attempts`.
    #[diesel(sql_type = Integer)]
    pub max_attempts: i32,
    /// Why the head job failed (its last attempt's error, cleaned).
    #[diesel(sql_type = Nullable<Text>)]
    pub last_error: Option<String>,
    /// When the head job failed: since then the key has been held up.
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub finished_at: Option<DateTime<Utc>>,
    /// Jobs waiting behind the head (`pending` and blocked), counted when
    /// read.
    #[diesel(sql_type = BigInt)]
    pub waiting: i64,
}

/// Up to `limit` blocked keys, oldest head first. See `sql/blocked_keys.sql`.
pub fn blocked_keys(conn: &mut PgConnection, limit: i64) -> QueryResult<Vec<BlockedKey>> {
    diesel::sql_query(include_str!("sql/blocked_keys.sql"))
        .bind::<BigInt, _>(limit)
        .load(conn)
}

/// Releases the blocked head of up to `limit` keys whose earlier jobs have all
/// ended, which a finish can miss in one interleaving with an enqueue (see
/// `sql/stranded_ordering_keys.sql`): the keys with a blocked job, then
/// `advance_ordering_keys` on them. Returns the ids released; the worker pool's
/// reaper calls it every pass.
pub fn advance_stranded_keys(conn: &mut PgConnection, limit: i64) -> QueryResult<Vec<i64>> {
    #[derive(QueryableByName)]
    struct KeyRow {
        #[diesel(sql_type = Text)]
        key: String,
    }
    let keys: Vec<String> = diesel::sql_query(STRANDED_KEYS_SQL)
        .bind::<BigInt, _>(limit)
        .load::<KeyRow>(conn)?
        .into_iter()
        .map(|r| r.key)
        .collect();
    advance_ordering_keys(conn, &keys)
}

pub(crate) const STRANDED_KEYS_SQL: &str = include_str!("sql/stranded_ordering_keys.sql");
pub(crate) const ADVANCE_KEYS_SQL: &str = include_str!("sql/advance_ordering_keys.sql");

/// Releases the next job of each key in `keys` whose earlier jobs have all
/// ended (after an operator cancelled one). Returns the ids released.
pub(crate) fn advance_ordering_keys(
    conn: &mut PgConnection,
    keys: &[String],
) -> QueryResult<Vec<i64>> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    #[derive(QueryableByName)]
    struct IdRow {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        id: i64,
    }
    Ok(diesel::sql_query(ADVANCE_KEYS_SQL)
        .bind::<diesel::sql_types::Array<Text>, _>(keys)
        .load::<IdRow>(conn)?
        .into_iter()
        .map(|r| r.id)
        .collect())
}
