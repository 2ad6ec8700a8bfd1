//! Fan-out: an order event and its deliveries, one per enabled endpoint
//! subscribed to the event's type, written in the event's own transaction.
//!
//! Every delivery to one endpoint of one order shares the ordering key
//! `endpoint:<endpoint id>:order:<order id>` (the endpoint gets the order's
//! events in order, and one endpoint's failed head holds back only its own
//! deliveries) and counts against the concurrency key `endpoint:<endpoint id>`,
//! whose limits the endpoint's row sets.

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Integer, Jsonb, Nullable, Text};
use serde_json::Value;

use super::place::IdempotencyKey;
use super::transition::KeyAge;
use super::webhook_key;
use crate::effects::jobs::new_job;
use crate::effects::{OrderPublish, OrderWebhook};
use crate::outbox::NewJob;

/// The ordering key of an order's deliveries to one endpoint.
pub fn delivery_key(endpoint_id: i64, order_id: i64) -> String {
    format!("endpoint:{endpoint_id}:order:{order_id}")
}

/// The concurrency key of every delivery to one endpoint: its `KeyLimit`
/// holds the endpoint's `max_in_flight`, `rate_limit` and breaker pause.
pub fn endpoint_key(endpoint_id: i64) -> String {
    format!("endpoint:{endpoint_id}")
}

/// An event just written, and where it goes.
#[derive(Debug, QueryableByName)]
pub(super) struct RecordedEvent {
    #[diesel(sql_type = BigInt)]
    pub event_id: i64,
    /// Enabled http(s) endpoints subscribed to the event, by id.
    #[diesel(sql_type = Array<BigInt>)]
    webhook_endpoints: Vec<i64>,
    /// Enabled NATS endpoints subscribed to the event, by id.
    #[diesel(sql_type = Array<BigInt>)]
    nats_endpoints: Vec<i64>,
    /// Whether the database has any endpoint at all (see the SQL).
    #[diesel(sql_type = Bool)]
    any_endpoint: bool,
}

/// Inserts event `seq` of the order and reads its subscribers, in one statement.
pub(super) fn record_event(
    conn: &mut PgConnection,
    order_id: i64,
    seq: i32,
    event_type: &str,
    data: Value,
    key: Option<&IdempotencyKey>,
    request_hash: Option<&str>,
) -> QueryResult<RecordedEvent> {
    diesel::sql_query(include_str!("sql/record_event.sql"))
        .bind::<BigInt, _>(order_id)
        .bind::<Integer, _>(seq)
        .bind::<Text, _>(event_type)
        .bind::<Jsonb, _>(data)
        .bind::<Nullable<Text>, _>(key.map(IdempotencyKey::as_str))
        .bind::<Nullable<Text>, _>(request_hash)
        .bind::<Nullable<BigInt>, _>(key.and_then(IdempotencyKey::api_key_id))
        .get_result(conn)
}

impl RecordedEvent {
    /// The event's deliveries, one job per subscribed endpoint.
    pub(super) fn deliveries(
        &self,
        order_id: i64,
        max_attempts: i32,
        keys: KeyAge,
    ) -> QueryResult<Vec<NewJob>> {
        if !self.any_endpoint {
            // No endpoints yet: one delivery to `default`, behind the order's
            // earlier such deliveries (the key they were queued under).
            let job = new_job(
                &OrderWebhook {
                    order_id,
                    event_id: Some(self.event_id),
                    endpoint_id: None,
                },
                &keys.options(max_attempts, webhook_key(order_id)),
            )?;
            return Ok(vec![job]);
        }
        let webhooks = self.webhook_endpoints.iter().map(|&endpoint_id| {
            new_job(
                &OrderWebhook {
                    order_id,
                    event_id: Some(self.event_id),
                    endpoint_id: Some(endpoint_id),
                },
                &keys
                    .options(max_attempts, delivery_key(endpoint_id, order_id))
                    .concurrency_key(endpoint_key(endpoint_id)),
            )
        });
        let publishes = self.nats_endpoints.iter().map(|&endpoint_id| {
            new_job(
                &OrderPublish {
                    order_id,
                    event_id: self.event_id,
                    endpoint_id,
                },
                &keys
                    .options(max_attempts, delivery_key(endpoint_id, order_id))
                    .concurrency_key(endpoint_key(endpoint_id)),
            )
        });
        webhooks.chain(publishes).collect()
    }
}
