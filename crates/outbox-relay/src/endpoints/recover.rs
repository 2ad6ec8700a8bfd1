//! `endpoints recover NAME --since 6h`: an endpoint's failed deliveries since
//! then, back to `pending`, once each, oldest first.
//!
//! A failed delivery is the head that blocks its ordering key (the order's
//! later events to that endpoint wait behind it); putting it back unblocks the
//! key, and the claim takes the order's deliveries in enqueue order again.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Text, Timestamptz};

use super::store::{DELIVERY_KINDS, StoreError, find};
use super::target::DEFAULT_ENDPOINT;
use crate::outbox::{self, RetrySelection};

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// The failed deliveries to endpoint `name` that failed at or after `since`,
/// oldest first; locked when `lock` (recover), not for a preview.
fn failed_since(
    conn: &mut PgConnection,
    name: &str,
    since: DateTime<Utc>,
    lock: bool,
) -> Result<Vec<i64>, StoreError> {
    let endpoint = find(conn, name)?;
    // Deliveries queued before endpoints existed name no endpoint: `default`'s.
    let sql = format!(
        "SELECT id FROM jobs \
         WHERE status = 'failed' AND kind = ANY($1) \
           AND coalesce(finished_at, created_at) >= $2 \
           AND (payload ->> 'endpoint_id' = $3::text \
                OR ($4 = '{DEFAULT_ENDPOINT}' AND NOT payload ? 'endpoint_id')) \
         ORDER BY id{}",
        if lock { " FOR UPDATE" } else { "" }
    );
    let ids: Vec<Id> = diesel::sql_query(sql)
        .bind::<Array<Text>, _>(DELIVERY_KINDS.to_vec())
        .bind::<Timestamptz, _>(since)
        .bind::<BigInt, _>(endpoint.id)
        .bind::<Text, _>(&endpoint.name)
        .load(conn)?;
    Ok(ids.into_iter().map(|i| i.id).collect())
}

/// How many deliveries [`recover`] would put back now (the dashboard's preview).
pub fn preview(
    conn: &mut PgConnection,
    name: &str,
    since: DateTime<Utc>,
) -> Result<usize, StoreError> {
    Ok(failed_since(conn, name, since, false)?.len())
}

/// Puts the endpoint's failed deliveries since `since` back to `pending`, in
/// one transaction; returns their ids, oldest first.
pub fn recover(
    conn: &mut PgConnection,
    name: &str,
    since: DateTime<Utc>,
) -> Result<Vec<i64>, StoreError> {
    conn.transaction(|conn| {
        let ids = failed_since(conn, name, since, true)?;
        if ids.is_empty() {
            return Ok(ids);
        }
        let report = outbox::retry_failed_jobs(conn, &RetrySelection::Ids(ids))?;
        Ok(report.retried)
    })
}
