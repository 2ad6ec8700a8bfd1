//! `place_order`: the order, its items and its jobs in ONE statement.

use diesel::prelude::*;
use diesel::result::Error as DieselError;
use diesel::sql_types::{Array, BigInt, Integer, Jsonb, Nullable, Text, Timestamptz};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio_postgres::types::Type;

use chrono::{DateTime, Utc};

use super::domain::NewOrder;
use super::email_key;
use super::events::{EventJobs, EventSubscribers, KeyAge, RecordedEvent, event_email_with};
use super::idempotency::{Cause, IdempotencyKey};
use super::jobs::{
    ConfirmationEmail, OrderFanout, OrderPublish, OrderWebhook, ReceiptPdf, new_job,
};
use super::read::{Order, OrderEvent, OrderItem, OrderJob};
use super::{OrderId, OrderStatus};
use crate::db::PrepareOnce;
use crate::outbox::{DependencyPolicy, Enqueuer, JobOptions, JobStatus, NewJob, OwnInsert, Parent};
use crate::schema::orders;
use crate::worker::JobArgs as _;

/// Where the receipt job sits among a placement's jobs: the confirmation
/// email, at index 0, names it as its parent.
const RECEIPT_INDEX: usize = 1;

/// What `place_order` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// A new order was written, with its jobs.
    Created(i64),
    /// The idempotency key was seen before with the same order: nothing was written.
    Existing(i64),
}

impl Placement {
    pub fn order_id(self) -> i64 {
        match self {
            Placement::Created(id) | Placement::Existing(id) => id,
        }
    }
}

/// What [`place_order`] did, with the order it created as
/// `GET /orders/{id}` shows it right after the commit: built from what the
/// placement wrote, so the caller needs no second read to answer with it.
#[derive(Debug, Clone)]
pub struct Placed {
    pub placement: Placement,
    /// `None` when the idempotency key found an earlier order.
    pub created: Option<PlacedOrder>,
}

impl Placed {
    /// The order placed, or found under the idempotency key.
    pub fn order_id(&self) -> i64 {
        self.placement.order_id()
    }
}

#[derive(Debug, Clone)]
pub struct PlacedOrder {
    pub order: Order,
    pub jobs: Vec<OrderJob>,
    pub events: Vec<OrderEvent>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlaceOrderError {
    #[error("idempotency key already used for a different order (order {existing_order_id})")]
    IdempotencyConflict { existing_order_id: i64 },
    #[error(transparent)]
    Database(#[from] DieselError),
}

/// What `sql/place_order.sql` returns for an order it wrote.
#[derive(QueryableByName)]
pub(super) struct PlacedRow {
    #[diesel(sql_type = BigInt)]
    pub(super) order_id: OrderId,
    #[diesel(sql_type = Timestamptz)]
    pub(super) created_at: DateTime<Utc>,
    /// `created_at` plus the payment window; none without one.
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub(super) expires_at: Option<DateTime<Utc>>,
    /// In the request's order.
    #[diesel(sql_type = Array<BigInt>)]
    pub(super) item_ids: Vec<i64>,
    #[diesel(sql_type = BigInt)]
    pub(super) event_id: i64,
    /// In enqueue order, with `job_kinds`.
    #[diesel(sql_type = Array<BigInt>)]
    pub(super) job_ids: Vec<i64>,
    #[diesel(sql_type = Array<Text>)]
    pub(super) job_kinds: Vec<String>,
}

/// The text of a placement's statement, and its parameters' types in
/// order, for a connection that prepares it itself (the API's own,
/// `api/direct.rs`).
pub(crate) const PLACE_ORDER_SQL: &str = include_str!("sql/place_order.sql");
pub(crate) const PLACE_ORDER_PARAMS: &[Type] = &[
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::INT8,
    Type::TEXT,
    Type::TEXT,
    Type::INT8,
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::INT4_ARRAY,
    Type::INT8_ARRAY,
    Type::TEXT,
    Type::INT8,
    Type::INT4,
    Type::INT8,
    Type::JSONB,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
];

/// What one placement writes, as the statement binds it.
pub(crate) struct Placing<'a> {
    pub(super) order: &'a NewOrder,
    /// Taken in `cause`'s space.
    pub(super) key: Option<IdempotencyKey>,
    /// The order's [`fingerprint`], with a key.
    pub(super) request_hash: Option<String>,
    pub(super) cause: Cause,
    pub(super) payment_window: Option<Duration>,
    pub(super) jobs: EventJobs,
}

impl<'a> Placing<'a> {
    pub(crate) fn new(
        order: &'a NewOrder,
        key: Option<&IdempotencyKey>,
        cause: Cause,
        payment_window: Option<Duration>,
        jobs: EventJobs,
    ) -> Placing<'a> {
        let key = cause.scope(key);
        let request_hash = key.as_ref().map(|_| fingerprint(order));
        Placing {
            order,
            key,
            request_hash,
            cause,
            payment_window,
            jobs,
        }
    }
}

/// The values a placement binds that are not already in [`Placing`].
pub(super) struct Columns<'a> {
    pub(super) window_ms: Option<i64>,
    pub(super) fanout_inline: i64,
    pub(super) skus: Vec<&'a str>,
    pub(super) names: Vec<&'a str>,
    pub(super) quantities: Vec<i32>,
    pub(super) prices: Vec<i64>,
}

impl<'a> Placing<'a> {
    pub(super) fn columns(&self) -> Columns<'a> {
        let items = self.order.items();
        Columns {
            // Whole milliseconds: the window was parsed from text such as `30m`.
            window_ms: self
                .payment_window
                .map(|w| i64::try_from(w.as_millis()).unwrap_or(i64::MAX)),
            fanout_inline: i64::try_from(self.jobs.fanout_inline).unwrap_or(i64::MAX),
            skus: items.iter().map(|i| i.sku.as_str()).collect(),
            names: items.iter().map(|i| i.name.as_str()).collect(),
            quantities: items.iter().map(|i| i.quantity.get()).collect(),
            prices: items.iter().map(|i| i.unit_price.cents()).collect(),
        }
    }
}

/// The order, its items, its first event and its jobs in one statement;
/// `None` when the idempotency key was taken, and nothing was written.
///
/// One statement, and outside a transaction no BEGIN or COMMIT around it: a
/// placement's cost is mostly its round trips (each is a client and a
/// server wake-up, and a TLS record each way), and a connection that waits
/// between the statements of a transaction holds its locks and its snapshot
/// meanwhile.
fn insert_placed(
    conn: &mut PgConnection,
    placing: &Placing<'_>,
    own: &OwnInsert,
) -> QueryResult<Option<PlacedRow>> {
    let order = placing.order;
    let c = placing.columns();
    // The binds of PLACE_ORDER_PARAMS, in its order.
    diesel::sql_query(PLACE_ORDER_SQL)
        .bind::<Text, _>(order.customer_email.as_str())
        .bind::<Text, _>(order.customer_name.as_str())
        .bind::<Text, _>(order.currency.code())
        .bind::<BigInt, _>(order.total().cents())
        .bind::<Nullable<Text>, _>(placing.key.as_ref().map(IdempotencyKey::as_str))
        .bind::<Nullable<Text>, _>(placing.request_hash.as_deref())
        .bind::<Nullable<BigInt>, _>(placing.cause.api_key_id)
        .bind::<Array<Text>, _>(&c.skus)
        .bind::<Array<Text>, _>(&c.names)
        .bind::<Array<Integer>, _>(&c.quantities)
        .bind::<Array<BigInt>, _>(&c.prices)
        .bind::<Text, _>(OrderStatus::Placed.event_type())
        .bind::<Nullable<BigInt>, _>(c.window_ms)
        .bind::<Integer, _>(placing.jobs.max_attempts)
        .bind::<BigInt, _>(c.fanout_inline)
        .bind::<Nullable<Jsonb>, _>(own.trace_context())
        .bind::<Nullable<Text>, _>(own.notify_channel())
        .bind::<Text, _>(ConfirmationEmail::KIND)
        .bind::<Text, _>(ReceiptPdf::KIND)
        .bind::<Text, _>(OrderWebhook::KIND)
        .bind::<Text, _>(OrderPublish::KIND)
        .bind::<Text, _>(OrderFanout::KIND)
        .prepared()
        .get_result(conn)
        .optional()
}

/// Writes the order, its items and one job per effect in one statement,
/// its own transaction (inside the caller's, when there is one);
/// `enqueuer` (the service's, [`order_enqueuer`](super::order_enqueuer),
/// with the API's waker in the API) wakes the relays once it has committed,
/// so a relay never wakes for an order it cannot see yet.
///
/// With an idempotency key, a repeat of the same order returns
/// [`Placement::Existing`]; the unique constraint on the key, not a prior check,
/// decides who wins when requests race.
pub fn place_order(
    conn: &mut PgConnection,
    enqueuer: &Enqueuer,
    order: &NewOrder,
    key: Option<&IdempotencyKey>,
    jobs: impl Into<EventJobs>,
) -> Result<Placed, PlaceOrderError> {
    place_order_by(conn, enqueuer, order, key, jobs, Cause::of_key(key), None)
}

/// [`place_order`] on behalf of `cause`, recorded on the order and its first
/// event; `key` is taken in `cause`'s space. With a `payment_window`
/// (`ORDER_PAYMENT_WINDOW`) the order's `expires_at` is its `created_at`
/// plus the window, and the relays' sweep expires it if it is still placed
/// then ([`super::expire_due_orders`]).
pub fn place_order_by(
    conn: &mut PgConnection,
    enqueuer: &Enqueuer,
    order: &NewOrder,
    key: Option<&IdempotencyKey>,
    jobs: impl Into<EventJobs>,
    cause: Cause,
    payment_window: Option<Duration>,
) -> Result<Placed, PlaceOrderError> {
    place_with(
        conn,
        enqueuer,
        &Placing::new(order, key, cause, payment_window, jobs.into()),
    )
}

/// [`place_order_by`] of what `placing` holds.
pub(crate) fn place_with(
    conn: &mut PgConnection,
    enqueuer: &Enqueuer,
    placing: &Placing<'_>,
) -> Result<Placed, PlaceOrderError> {
    // The parent of every job this order enqueues (their trace context is
    // this span's), so its effects hang under the placement.
    let span = tracing::info_span!("place_order", order_id = tracing::field::Empty);
    let _entered = span.enter();
    let own = enqueuer.own_insert(conn);
    let Some(row) = insert_placed(conn, placing, &own)? else {
        // Nothing written, no one to wake.
        drop(own);
        return earlier_placement(conn, placing.key.as_ref(), placing.request_hash.as_deref());
    };
    Ok(placed(placing, row, own, &span))
}

/// What a placement that wrote `row` did, told to `own` (which wakes the
/// relays) and to `span`; built from what it wrote, as `GET /orders/{id}`
/// shows it right after the commit.
pub(super) fn placed(
    placing: &Placing<'_>,
    row: PlacedRow,
    own: OwnInsert,
    span: &tracing::Span,
) -> Placed {
    let PlacedRow {
        order_id,
        created_at,
        expires_at,
        item_ids,
        event_id,
        job_ids,
        job_kinds,
    } = row;
    let order = placing.order;
    own.inserted(job_kinds.iter().map(String::as_str));
    span.record("order_id", order_id.get());
    // Every default timestamp of the statement is its transaction's start,
    // now(): created_at of the order and the event, run_after of the jobs.
    let max_attempts = placing.jobs.max_attempts.max(1);
    let created = PlacedOrder {
        order: Order {
            id: order_id,
            customer_email: order.customer_email.as_str().to_owned(),
            customer_name: order.customer_name.as_str().to_owned(),
            currency: order.currency,
            total_cents: order.total().cents(),
            status: OrderStatus::Placed,
            created_at,
            expires_at,
            items: item_ids
                .into_iter()
                .zip(order.items())
                .map(|(id, item)| OrderItem {
                    id,
                    sku: item.sku.as_str().to_owned(),
                    name: item.name.as_str().to_owned(),
                    quantity: item.quantity.get(),
                    unit_price_cents: item.unit_price.cents(),
                })
                .collect(),
        },
        jobs: job_ids
            .into_iter()
            .zip(job_kinds)
            .map(|(id, kind)| OrderJob {
                id,
                kind,
                status: JobStatus::Pending.as_str().to_owned(),
                attempts: 0,
                max_attempts,
                run_after: created_at,
                finished_at: None,
            })
            .collect(),
        events: vec![OrderEvent {
            id: event_id,
            order_id,
            seq: 1,
            event_type: OrderStatus::Placed.event_type().to_owned(),
            data: serde_json::json!({}),
            created_at,
        }],
    };
    Placed {
        placement: Placement::Created(order_id.get()),
        created: Some(created),
    }
}

/// The order an earlier request placed under `key`: a concurrent or earlier
/// request won. ON CONFLICT waited for its transaction, so this statement's
/// snapshot, taken after it, sees its row. The same order again is
/// [`Placement::Existing`]; another is a conflict.
fn earlier_placement(
    conn: &mut PgConnection,
    key: Option<&IdempotencyKey>,
    fingerprint: Option<&str>,
) -> Result<Placed, PlaceOrderError> {
    // Without a key nothing can conflict: were it to, an error, not a panic.
    let Some(key) = key else {
        return Err(PlaceOrderError::Database(DieselError::NotFound));
    };
    let same_key = orders::table
        .filter(orders::idempotency_key.eq(key.as_str()))
        .into_boxed();
    let same_key = match key.api_key_id() {
        Some(id) => same_key.filter(orders::api_key_id.eq(id)),
        None => same_key.filter(orders::api_key_id.is_null()),
    };
    let (existing_id, existing_hash): (i64, Option<String>) = same_key
        .select((orders::id, orders::request_hash))
        .first(conn)?;
    if existing_hash.as_deref() == fingerprint {
        Ok(Placed {
            placement: Placement::Existing(existing_id),
            created: None,
        })
    } else {
        Err(PlaceOrderError::IdempotencyConflict {
            existing_order_id: existing_id,
        })
    }
}

/// The jobs of a placement as [`Enqueuer::enqueue_many`] was given them
/// before the placement wrote its jobs in its own statement: the reference
/// `sql/place_order.sql` is held to (the integration tests enqueue these
/// beside a placement's own and compare the rows). `subscribers`: those of
/// `order.placed` when the order was placed.
pub fn placement_jobs(
    order_id: OrderId,
    event_id: i64,
    subscribers: &EventSubscribers,
    jobs: EventJobs,
) -> QueryResult<Vec<NewJob>> {
    // The confirmation carries the receipt, so it waits for the receipt
    // job (the next of this batch); policy `run`: a receipt that failed
    // must not hold the confirmation, which then goes with the link only.
    let confirmation = KeyAge::New
        .options(jobs.max_attempts, email_key(order_id.get()))
        .depends_on([Parent::InBatch(RECEIPT_INDEX)])
        .dependency_policy(DependencyPolicy::Run);
    let mut queued = vec![
        event_email_with(order_id, event_id, confirmation)?,
        new_job(
            &ReceiptPdf { order_id },
            &JobOptions::default().max_attempts(jobs.max_attempts),
        )?,
    ];
    let event = RecordedEvent::placed(event_id, subscribers);
    queued.extend(event.deliveries(order_id, jobs, KeyAge::New, false)?);
    Ok(queued)
}

/// SHA-256 of the parsed order, so the same order sent with different JSON
/// spacing or key order counts as the same request.
fn fingerprint(order: &NewOrder) -> String {
    let canonical = serde_json::json!({
        "customer_email": order.customer_email.as_str(),
        "customer_name": order.customer_name.as_str(),
        "currency": order.currency.code(),
        "items": order.items().iter().map(|i| serde_json::json!([
            i.sku.as_str(), i.name.as_str(), i.quantity.get(), i.unit_price.cents()
        ])).collect::<Vec<_>>(),
    });
    hex::encode(Sha256::digest(canonical.to_string().as_bytes()))
}
