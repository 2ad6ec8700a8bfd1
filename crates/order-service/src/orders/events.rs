//! An order's events and the jobs each one queues, shared by the placement
//! ([`super::place`]) and the transitions ([`super::transition`]), which
//! import this module and never each other.
//!
//! An event is written with the next `seq` of its order, in the transaction
//! that changes the order, together with its jobs: a delivery per enabled
//! endpoint subscribed to the event's type (the fan-out) and, for some
//! events, an email.
//!
//! Past [`EventJobs::fanout_inline`] subscribed endpoints, the event's
//! transaction queues one `order_fanout` job instead of the deliveries
//! ([`super::fanout`] writes them after commit), so an order's transaction
//! costs the same with a thousand subscribers as with one. An order's fan-outs
//! share one ordering key, and while one is unfinished the order's later
//! events go through a fan-out too, so no delivery overtakes an earlier
//! event's.
//!
//! Every delivery to one endpoint of one order shares the ordering key
//! `endpoint:<endpoint id>:order:<order id>` (the endpoint gets the order's
//! events in order, and one endpoint's failed head holds back only its own
//! deliveries) and counts against the concurrency key `endpoint:<endpoint id>`,
//! whose limits the endpoint's row sets. One exception: an order placed
//! while no endpoint existed has its first deliveries queued without an
//! endpoint (unaddressed), for `default`, under the key [`webhook_key`];
//! while any of those is unfinished, the order's later deliveries to
//! `default` take that key too, and queue behind them.

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Integer, Jsonb, Nullable, Text};
use serde_json::Value;

use super::idempotency::{Cause, IdempotencyKey};
use super::jobs::{
    ConfirmationEmail, OrderEmail, OrderFanout, OrderPublish, OrderWebhook, new_job,
};
use super::{DEFAULT_ENDPOINT, OrderId, email_key, fanout_key, webhook_key};
use crate::db::PrepareOnce;
use crate::outbox::{Enqueuer, JobOptions, NewJob};
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

/// Subscribed endpoints an event's own transaction queues deliveries for, at
/// most (`FANOUT_INLINE`); past it, one `order_fanout` job writes them.
pub const DEFAULT_FANOUT_INLINE: usize = 16;

/// How the jobs of an order's events are queued: the `max_attempts` they get
/// (`JOB_MAX_ATTEMPTS`) and the most deliveries the event's transaction writes
/// itself (`FANOUT_INLINE`). An `i32` is the first with the default second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventJobs {
    pub max_attempts: i32,
    pub fanout_inline: usize,
}

impl From<i32> for EventJobs {
    fn from(max_attempts: i32) -> Self {
        EventJobs {
            max_attempts,
            fanout_inline: DEFAULT_FANOUT_INLINE,
        }
    }
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
    /// The endpoint named `default`, while the order has an unfinished
    /// unaddressed delivery (see the SQL); none for a placement.
    #[diesel(sql_type = Nullable<BigInt>)]
    default_behind_unaddressed: Option<i64>,
}

/// The endpoints an event type goes to, as `order_event_subscribers` (in
/// the migration) reads them.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct EventSubscribers {
    /// Enabled http(s) endpoints subscribed to the type, by id, ascending.
    #[diesel(sql_type = Array<BigInt>)]
    pub webhook_endpoints: Vec<i64>,
    /// Enabled NATS endpoints subscribed to the type, by id, ascending.
    #[diesel(sql_type = Array<BigInt>)]
    pub nats_endpoints: Vec<i64>,
    /// Whether the database has any endpoint at all.
    #[diesel(sql_type = Bool)]
    pub any_endpoint: bool,
}

impl RecordedEvent {
    /// A new order's first event, going to `subscribers`: nothing of the
    /// order was queued before it, so nothing is unaddressed.
    pub(super) fn placed(event_id: i64, subscribers: &EventSubscribers) -> RecordedEvent {
        RecordedEvent {
            event_id,
            webhook_endpoints: subscribers.webhook_endpoints.clone(),
            nats_endpoints: subscribers.nats_endpoints.clone(),
            any_endpoint: subscribers.any_endpoint,
            default_behind_unaddressed: None,
        }
    }
}

/// An event of a transition: [`RecordedEvent`], and whether an earlier
/// event's fan-out is unfinished, which this one's deliveries must not
/// overtake.
#[derive(Debug, QueryableByName)]
pub(super) struct TransitionEvent {
    #[diesel(embed)]
    pub event: RecordedEvent,
    #[diesel(sql_type = Bool)]
    pub behind_fanout: bool,
}

/// Inserts event `seq` of the order and reads its subscribers, whether its
/// unaddressed deliveries' key still has unfinished jobs, and whether its
/// fan-out key has, in
/// one statement. The caller holds the order row's lock. `key`: the
/// request's Idempotency-Key and the hash of the request, stored with the
/// event.
pub(super) fn record_event(
    conn: &mut PgConnection,
    order_id: OrderId,
    seq: i32,
    event_type: &str,
    data: Value,
    key: Option<(&IdempotencyKey, &str)>,
    cause: Cause,
) -> QueryResult<TransitionEvent> {
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
        .bind::<Text, _>(fanout_key(order_id.get()))
        .prepared()
        .get_result(conn)
}

impl RecordedEvent {
    /// The event's deliveries, one job per subscribed endpoint, or the one
    /// `order_fanout` job that writes them after commit: past
    /// `jobs.fanout_inline` endpoints, or `behind_fanout`.
    pub(super) fn deliveries(
        &self,
        order_id: OrderId,
        jobs: EventJobs,
        keys: KeyAge,
        behind_fanout: bool,
    ) -> QueryResult<Vec<NewJob>> {
        if !self.any_endpoint {
            // No endpoints yet: one unaddressed delivery, for `default`,
            // behind the order's earlier ones (the key they were queued under).
            let job = new_job(
                &OrderWebhook {
                    order_id,
                    event_id: self.event_id,
                    endpoint_id: None,
                },
                &keys.options(jobs.max_attempts, webhook_key(order_id.get())),
            )?;
            return Ok(vec![job]);
        }
        let subscribed = self.webhook_endpoints.len() + self.nats_endpoints.len();
        if behind_fanout || subscribed > jobs.fanout_inline {
            let fanout = OrderFanout {
                order_id,
                event_id: self.event_id,
                max_attempts: jobs.max_attempts,
                webhook_endpoints: self.webhook_endpoints.clone(),
                nats_endpoints: self.nats_endpoints.clone(),
                default_behind_unaddressed: self.default_behind_unaddressed,
            };
            let options = keys.options(jobs.max_attempts, fanout_key(order_id.get()));
            return Ok(vec![new_job(&fanout, &options)?]);
        }
        Subscribers {
            event_id: self.event_id,
            webhook_endpoints: &self.webhook_endpoints,
            nats_endpoints: &self.nats_endpoints,
            default_behind_unaddressed: self.default_behind_unaddressed,
        }
        .deliveries(order_id, jobs.max_attempts, keys)
    }
}

/// The endpoints an event goes to, as its transaction read them: the
/// deliveries are the same whether that transaction or a fan-out writes them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Subscribers<'a> {
    pub event_id: i64,
    pub webhook_endpoints: &'a [i64],
    pub nats_endpoints: &'a [i64],
    /// See [`RecordedEvent`]'s field of that name.
    pub default_behind_unaddressed: Option<i64>,
}

impl Subscribers<'_> {
    /// One delivery job per endpoint: webhooks first, then publishes, each
    /// in the order given.
    pub(super) fn deliveries(
        &self,
        order_id: OrderId,
        max_attempts: i32,
        keys: KeyAge,
    ) -> QueryResult<Vec<NewJob>> {
        let webhooks = self.webhook_endpoints.iter().map(|&endpoint_id| {
            new_job(
                &OrderWebhook {
                    order_id,
                    event_id: self.event_id,
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
    /// endpoint's own, except for `default` while the order has an
    /// unfinished unaddressed delivery: then their key ([`webhook_key`]), so
    /// the delivery runs after the deliveries queued for `default` while no
    /// endpoint existed (it keeps `default`'s concurrency key). The switch to
    /// the endpoint's key comes only once that key has drained: deliveries
    /// queued under it meanwhile are unfinished jobs of that key themselves,
    /// so every one of them has ended before an event takes the endpoint's
    /// key, and nothing under that key can overtake them.
    fn webhook_ordering_key(&self, endpoint_id: i64, order_id: OrderId) -> String {
        if self.default_behind_unaddressed == Some(endpoint_id) {
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

/// The email about one later event (`order_email`), behind the order's
/// earlier emails.
pub(super) fn event_email(
    order_id: OrderId,
    event_id: i64,
    max_attempts: i32,
    keys: KeyAge,
) -> QueryResult<NewJob> {
    new_job(
        &OrderEmail { order_id, event_id },
        &keys.options(max_attempts, email_key(order_id.get())),
    )
}

/// The confirmation of a placed order (its event `event_id`) with `options`
/// as the caller set them (it also waits for the receipt it attaches).
pub(super) fn event_email_with(
    order_id: OrderId,
    event_id: i64,
    options: JobOptions,
) -> QueryResult<NewJob> {
    new_job(&ConfirmationEmail { order_id, event_id }, &options)
}

/// A transition's event, before it is written.
#[derive(Debug)]
pub(super) struct NextEvent<'a> {
    pub event_type: &'a str,
    pub data: Value,
    /// The request's Idempotency-Key and the hash of the request.
    pub key: Option<(&'a IdempotencyKey, &'a str)>,
    pub cause: Cause,
    /// Whether the customer is mailed about it.
    pub email: bool,
}

/// Writes `event` as the order's next (the caller holds the order row's
/// lock) and queues its jobs with `enqueuer`, behind the order's earlier
/// ones: its deliveries, and its email when it has one. Returns the
/// event's id.
pub(super) fn record_and_enqueue(
    conn: &mut PgConnection,
    enqueuer: &Enqueuer,
    order_id: OrderId,
    event: NextEvent<'_>,
    jobs: EventJobs,
) -> QueryResult<i64> {
    let seq = next_seq(conn, order_id)?;
    let recorded = record_event(
        conn,
        order_id,
        seq,
        event.event_type,
        event.data,
        event.key,
        event.cause,
    )?;
    let event_id = recorded.event.event_id;
    let mut queued =
        recorded
            .event
            .deliveries(order_id, jobs, KeyAge::Used, recorded.behind_fanout)?;
    if event.email {
        queued.push(event_email(
            order_id,
            event_id,
            jobs.max_attempts,
            KeyAge::Used,
        )?);
    }
    enqueuer.enqueue_many(conn, &queued)?;
    Ok(event_id)
}
