//! An order's events and the jobs each one queues, shared by the placement
//! ([`super::place`]) and the transitions ([`super::transition`]), which
//! import this module and never each other.
//!
//! An event is written with the next `seq` of its order, in the transaction
//! that changes the order, together with its jobs: a delivery per enabled
//! endpoint subscribed to the event's type (the fan-out) and, for some
//! events, an email.
//!
//! Every delivery to one endpoint of one order shares the ordering key
//! `endpoint:<endpoint id>:order:<order id>` (the endpoint gets the order's
//! events in order, and one endpoint's failed head holds back only its own
//! deliveries) and counts against the concurrency key `endpoint:<endpoint id>`,
//! whose limits the endpoint's row sets. One exception: an order placed
//! before any endpoint existed has its first deliveries queued without an
//! endpoint, for `default`, under its legacy key ([`webhook_key`]); while any
//! of those is unfinished, the order's later deliveries to `default` take
//! that key too, and queue behind them.

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Integer, Jsonb, Nullable, Text};
use serde_json::Value;

use super::idempotency::{Cause, IdempotencyKey};
use super::jobs::{ConfirmationEmail, OrderPublish, OrderWebhook, new_job};
use super::{DEFAULT_ENDPOINT, OrderId, email_key, webhook_key};
use crate::outbox::{JobOptions, NewJob};
use crate::schema::order_events;

/// The ordering key of an order's deliveries to one endpoint.
pub fn delivery_key(endpoint_id: i64, order_id: i64) -> String {
    format!("endpoint:{endpoint_id}:order:{order_id}")
}

/// The concurrency key of every delivery to one endpoint: its `ConcurrencyLimit`
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
    /// The endpoint named `default`, while the order has an unfinished job
    /// under its legacy key (see the SQL); none for a placement.
    #[diesel(sql_type = Nullable<BigInt>)]
    default_behind_legacy: Option<i64>,
}

/// Inserts event `seq` of the order and reads its subscribers, and whether
/// its legacy key still has unfinished jobs, in one statement. The caller
/// holds the order row's lock. `key`: the request's Idempotency-Key and the
/// hash of the request, stored with the event.
pub(super) fn record_event(
    conn: &mut PgConnection,
    order_id: OrderId,
    seq: i32,
    event_type: &str,
    data: Value,
    key: Option<(&IdempotencyKey, &str)>,
    cause: Cause,
) -> QueryResult<RecordedEvent> {
    let (key, request_hash) = key.unzip();
    diesel::sql_query(include_str!("sql/record_event.sql"))
        .bind::<BigInt, _>(order_id)
        .bind::<Integer, _>(seq)
        .bind::<Text, _>(event_type)
        .bind::<Jsonb, _>(data)
        .bind::<Nullable<Text>, _>(key.map(IdempotencyKey::as_str))
        .bind::<Nullable<Text>, _>(request_hash)
        .bind::<Nullable<BigInt>, _>(cause.api_key_id)
        .bind::<Text, _>(webhook_key(order_id.get()))
        .bind::<Text, _>(DEFAULT_ENDPOINT)
        .bind::<Nullable<BigInt>, _>(cause.inbox_message_id)
        .get_result(conn)
}

impl RecordedEvent {
    /// The event's deliveries, one job per subscribed endpoint.
    pub(super) fn deliveries(
        &self,
        order_id: OrderId,
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
                &keys.options(max_attempts, webhook_key(order_id.get())),
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
                    .options(
                        max_attempts,
                        self.webhook_ordering_key(endpoint_id, order_id),
                    )
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
                    .options(max_attempts, delivery_key(endpoint_id, order_id.get()))
                    .concurrency_key(endpoint_key(endpoint_id)),
            )
        });
        webhooks.chain(publishes).collect()
    }

    /// The ordering key of the event's webhook to `endpoint_id`: the
    /// endpoint's own, except for `default` while the order's legacy key has
    /// an unfinished job: then the legacy key, so the delivery runs after the
    /// deliveries queued for `default` before endpoints existed (it keeps
    /// `default`'s concurrency key). The switch to the endpoint's key comes
    /// only once the legacy key has drained: deliveries queued under it
    /// meanwhile are unfinished jobs of that key themselves, so every one of
    /// them has ended before an event takes the endpoint's key, and nothing
    /// under that key can overtake them.
    fn webhook_ordering_key(&self, endpoint_id: i64, order_id: OrderId) -> String {
        if self.default_behind_legacy == Some(endpoint_id) {
            webhook_key(order_id.get())
        } else {
            delivery_key(endpoint_id, order_id.get())
        }
    }
}

/// The `seq` of the order's next event; the caller holds the order row's lock.
pub(super) fn next_seq(conn: &mut PgConnection, order_id: OrderId) -> QueryResult<i32> {
    Ok(order_events::table
        .filter(order_events::order_id.eq(order_id))
        .select(diesel::dsl::max(order_events::seq))
        .first::<Option<i32>>(conn)?
        .unwrap_or(0)
        + 1)
}

/// Whether an order's ordering keys may already have jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeyAge {
    /// The placement's: the keys are named after an order nobody else can
    /// see yet, so the enqueue skips their locks and head lookups.
    New,
    /// A transition's: earlier events' jobs may still be unfinished.
    Used,
}

impl KeyAge {
    pub(super) fn options(self, max_attempts: i32, key: String) -> JobOptions {
        let options = JobOptions::default().max_attempts(max_attempts);
        match self {
            KeyAge::New => options.new_ordering_key(key),
            KeyAge::Used => options.ordering_key(key),
        }
    }
}

/// The email about one event, behind the order's earlier emails.
pub(super) fn event_email(
    order_id: OrderId,
    event_id: i64,
    max_attempts: i32,
    keys: KeyAge,
) -> QueryResult<NewJob> {
    event_email_with(
        order_id,
        event_id,
        keys.options(max_attempts, email_key(order_id.get())),
    )
}

/// The email about one event with `options` as the caller set them (the
/// placement's confirmation also waits for the receipt it attaches).
pub(super) fn event_email_with(
    order_id: OrderId,
    event_id: i64,
    options: JobOptions,
) -> QueryResult<NewJob> {
    new_job(
        &ConfirmationEmail {
            order_id,
            event_id: Some(event_id),
        },
        &options,
    )
}
