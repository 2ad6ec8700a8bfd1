//! `endpoints recover NAME --since 6h`: an endpoint's failed deliveries since
//! then, back to `pending`, once each, oldest first.
//!
//! A failed delivery is the head that blocks its ordering key (the order's
//! later events to that endpoint wait behind it); putting it back unblocks the
//! key, and the claim takes the order's deliveries in enqueue order again.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Nullable, Text, Timestamptz};

use super::store::{DELIVERY_KINDS, StoreError, find};
use super::target::DEFAULT_ENDPOINT;
use crate::outbox::{self, RetrySelection};

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// Which failures to put back: those at or after `since` and, when set, at or
/// before `until`. The dashboard sets `until` to the time of its preview, so
/// that the operator confirms the deliveries that were counted, not ones that
/// failed while they read the count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub since: DateTime<Utc>,
    pub until: Option<DateTime<Utc>>,
}

impl Window {
    /// Every failure from `since` on.
    pub fn since(since: DateTime<Utc>) -> Window {
        Window { since, until: None }
    }
}

/// The failed deliveries to endpoint `name` that failed within `window`,
/// oldest first; locked when `lock` (recover), not for a preview.
fn failed_since(
    conn: &mut PgConnection,
    name: &str,
    window: Window,
    lock: bool,
) -> Result<Vec<i64>, StoreError> {
    let endpoint = find(conn, name)?;
    // Deliveries queued before endpoints existed name no endpoint: `default`'s.
    let sql = format!(
        "SELECT id FROM jobs \
         WHERE status = 'failed' AND kind = ANY($1) \
           AND coalesce(finished_at, created_at) >= $2 \
           AND ($5::timestamptz IS NULL OR coalesce(finished_at, created_at) <= $5) \
           AND (payload ->> 'endpoint_id' = $3::text \
                OR ($4 = '{DEFAULT_ENDPOINT}' AND NOT payload ? 'endpoint_id')) \
         ORDER BY id{}",
        if lock { " FOR UPDATE" } else { "" }
    );
    let ids: Vec<Id> = diesel::sql_query(sql)
        .bind::<Array<Text>, _>(DELIVERY_KINDS.to_vec())
        .bind::<Timestamptz, _>(window.since)
        .bind::<BigInt, _>(endpoint.id)
        .bind::<Text, _>(&endpoint.name)
        .bind::<Nullable<Timestamptz>, _>(window.until)
        .load(conn)?;
    Ok(ids.into_iter().map(|i| i.id).collect())
}

/// How many deliveries [`recover`] would put back now (`--dry-run`, the
/// dashboard's preview).
pub fn preview(conn: &mut PgConnection, name: &str, window: Window) -> Result<usize, StoreError> {
    Ok(failed_since(conn, name, window, false)?.len())
}

/// Puts the endpoint's failed deliveries within `window` back to `pending`,
/// in one transaction; returns their ids, oldest first.
pub fn recover(
    conn: &mut PgConnection,
    name: &str,
    window: Window,
) -> Result<Vec<i64>, StoreError> {
    conn.transaction(|conn| {
        let ids = failed_since(conn, name, window, true)?;
        if ids.is_empty() {
            return Ok(ids);
        }
        let report = outbox::retry_failed_jobs(conn, &RetrySelection::Ids(ids))?;
        Ok(report.retried)
    })
}
