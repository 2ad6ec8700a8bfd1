//! Reads the orders and events of publish jobs together, and renders each
//! body where it was read: the jobs of one claim start at the same moment,
//! and each would otherwise spend three database round trips (order, items,
//! event) before its publish: several times what the publish and its PubAck
//! take (docs/performance.md, "A publish job's own CPU").
//!
//! Each job sends its `(order, event)` to one loader task and awaits the
//! answer (a `MicroBatcher`). The loader reads every request waiting at
//! that moment in one statement (`load_batch.sql`) on one pooled
//! connection: one transaction per batch, where three (orders, items,
//! events) were most of the transactions a publish job cost the database.
//! Requests arriving meanwhile form the next batch.
//!
//! An event delivered to several endpoints is one pair asked several times:
//! its body is rendered once per batch, and each delivery gets a copy of
//! the bytes, not a rendering of its own.
//!
//! One row that does not decode (a currency code this build does not know)
//! fails the statement that read it, and so the whole batch: the batch is
//! then read again one request at a time, so that only that order's job
//! fails, permanently and saying why, as the other order jobs'
//! `OrderLoader` does. A pair the statement did not find is read alone too,
//! to say whether its order or its event is gone.
//!
//! A job gets its body, not the order: rendering it from the rows the batch
//! read saves copying each order, its items and its event for the job, and
//! rendering it again from the copies.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Integer, Jsonb, Nullable, Text, Timestamptz};
use outbox_core::worker::EffectError;

use super::micro_batch::{Batch, Lost, MicroBatcher};
use crate::db::{PgPool, PrepareOnce as _, run_blocking};
use crate::effects::webhook::body::event_body;
use crate::orders::{
    Currency, EventId, Order, OrderEvent, OrderId, OrderItem, OrderStatus, load_event, load_order,
};

/// What a publish needs of its order and event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// The event's type (`order.paid`), for the subject.
    pub event_type: String,
    /// The webhook body of the order and event, as published: an event sent
    /// to several endpoints shares one.
    pub body: bytes::Bytes,
}

type Loaded = Result<Rendered, EffectError>;

/// Reads a batch of `(order, event)` pairs (`$1` the orders' ids, `$2` the
/// events', side by side); the bench replays it to measure what a publish's
/// read costs the server.
pub const LOAD_BATCH_SQL: &str = include_str!("load_batch.sql");

/// Most `(order, event)` pairs one read asks for: a whole claim's, which at
/// the default concurrency (64) runs past 64 as the producer claims ahead;
/// capped at 64, one claim in three was read in two statements, two
/// transactions (354 reads for 309 claims in a drain of 20,000). The bench
/// replays the reads this many a statement.
pub const MAX_PAIRS_PER_READ: usize = 256;

/// Loads `(order, event)` pairs in batches. Cloning shares the loader.
#[derive(Debug, Clone)]
pub struct BatchLoader(MicroBatcher<Reader>);

impl BatchLoader {
    pub fn new(pool: PgPool) -> BatchLoader {
        BatchLoader(MicroBatcher::new(Reader { pool }))
    }

    /// Starts reading `pairs` in one batch now, without waiting: what the
    /// publish jobs of one claim will need, read as the claim returns. Each
    /// answer is [`Prefetched::get`], in the order of `pairs`.
    pub fn prefetch(&self, pairs: Vec<(OrderId, EventId)>) -> Vec<Prefetched> {
        let requests = pairs
            .into_iter()
            .map(|(order_id, event_id)| (order_id, event_id.get()))
            .collect();
        self.0
            .ask_all(requests)
            .into_iter()
            .map(Prefetched)
            .collect()
    }

    /// The order and the event, read with those of the other jobs asking at
    /// the same time. A database error is retryable; an order or event that
    /// no longer exists is permanent.
    pub async fn load(&self, order_id: OrderId, event_id: EventId) -> Loaded {
        self.0
            .ask((order_id, event_id.get()))
            .await
            .map_err(|lost| match lost {
                Lost::Stopped => EffectError::retryable("the order loader has stopped"),
                Lost::Dropped => EffectError::retryable("the order loader dropped the request"),
            })?
    }
}

/// A read [`BatchLoader::prefetch`] started.
#[derive(Debug)]
pub struct Prefetched(tokio::sync::oneshot::Receiver<Loaded>);

impl Prefetched {
    /// What the read found; `None` if the loader lost the request, which
    /// the caller then reads again.
    pub async fn get(self) -> Option<Loaded> {
        self.0.await.ok()
    }
}

/// One statement a batch, on one pooled connection.
#[derive(Debug)]
struct Reader {
    pool: PgPool,
}

impl Batch for Reader {
    type Request = (OrderId, i64);
    type Answer = Loaded;
    const MAX_BATCH: usize = MAX_PAIRS_PER_READ;
    /// Most batches read at once.
    const MAX_IN_FLIGHT: usize = 2;

    async fn serve(&self, wanted: Vec<(OrderId, i64)>) -> Vec<Loaded> {
        let asked = wanted.clone();
        match run_blocking(&self.pool, move |conn| Ok(read_batch(conn, &wanted)?)).await {
            Ok(loaded) => loaded,
            Err(error) => asked
                .iter()
                .map(|(order_id, event_id)| {
                    Err(EffectError::retryable(format!(
                        "loading order {order_id} and event {event_id}: {error}"
                    )))
                })
                .collect(),
        }
    }
}

/// The outcome of each `(order, event)` of `wanted`, in its order. `Err` only
/// for a database error, which no request is to blame for.
fn read_batch(
    conn: &mut PgConnection,
    wanted: &[(OrderId, i64)],
) -> diesel::QueryResult<Vec<Loaded>> {
    let order_ids: Vec<i64> = wanted.iter().map(|(order, _)| order.get()).collect();
    let event_ids: Vec<i64> = wanted.iter().map(|(_, event)| *event).collect();
    // Prepared once a connection: unnamed, it was planned on every call,
    // 3.5 µs a publish job (docs/performance.md).
    let read: Result<Vec<PairRow>, _> = diesel::sql_query(LOAD_BATCH_SQL)
        .bind::<Array<BigInt>, _>(&order_ids)
        .bind::<Array<BigInt>, _>(&event_ids)
        .prepared()
        .load(conn);
    let rows = match read {
        Ok(rows) => rows,
        Err(diesel::result::Error::DeserializationError(_)) => {
            return wanted
                .iter()
                .map(|&(order_id, event_id)| read_one(conn, order_id, event_id))
                .collect();
        }
        Err(error) => return Err(error),
    };
    // One body per pair, however many deliveries of it the batch holds.
    let mut rendered: HashMap<(OrderId, i64), Loaded> = rows
        .into_iter()
        .map(|row| {
            let key = (row.order_id, row.event_id);
            let (order, event) = row.into_parts();
            (key, render(&order, &event))
        })
        .collect();
    let mut loaded = Vec::with_capacity(wanted.len());
    for (i, &(order_id, event_id)) in wanted.iter().enumerate() {
        let last_of_pair = !wanted[i + 1..].contains(&(order_id, event_id));
        let answer = if last_of_pair {
            rendered.remove(&(order_id, event_id))
        } else {
            rendered.get(&(order_id, event_id)).cloned()
        };
        loaded.push(match answer {
            Some(answer) => answer,
            // Gone, or never there: read alone, to say which.
            None => read_one(conn, order_id, event_id)?,
        });
    }
    Ok(loaded)
}

/// One `(order, event)` of `load_batch.sql`, the order's items as arrays.
#[derive(QueryableByName)]
struct PairRow {
    #[diesel(sql_type = BigInt)]
    order_id: OrderId,
    #[diesel(sql_type = Text)]
    customer_email: String,
    #[diesel(sql_type = Text)]
    customer_name: String,
    #[diesel(sql_type = Text)]
    currency: Currency,
    #[diesel(sql_type = BigInt)]
    total_cents: i64,
    #[diesel(sql_type = Text)]
    status: OrderStatus,
    #[diesel(sql_type = Timestamptz)]
    created_at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    expires_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = BigInt)]
    event_id: i64,
    #[diesel(sql_type = Integer)]
    seq: i32,
    #[diesel(sql_type = Text)]
    event_type: String,
    #[diesel(sql_type = Jsonb)]
    data: serde_json::Value,
    #[diesel(sql_type = Timestamptz)]
    event_created_at: DateTime<Utc>,
    #[diesel(sql_type = Array<BigInt>)]
    item_ids: Vec<i64>,
    #[diesel(sql_type = Array<Text>)]
    item_skus: Vec<String>,
    #[diesel(sql_type = Array<Text>)]
    item_names: Vec<String>,
    #[diesel(sql_type = Array<Integer>)]
    item_quantities: Vec<i32>,
    #[diesel(sql_type = Array<BigInt>)]
    item_prices: Vec<i64>,
}

impl PairRow {
    fn into_parts(self) -> (Order, OrderEvent) {
        let items = self
            .item_ids
            .into_iter()
            .zip(self.item_skus)
            .zip(self.item_names)
            .zip(self.item_quantities)
            .zip(self.item_prices)
            .map(
                |((((id, sku), name), quantity), unit_price_cents)| OrderItem {
                    id,
                    sku,
                    name,
                    quantity,
                    unit_price_cents,
                },
            )
            .collect();
        let order = Order {
            id: self.order_id,
            customer_email: self.customer_email,
            customer_name: self.customer_name,
            currency: self.currency,
            total_cents: self.total_cents,
            status: self.status,
            created_at: self.created_at,
            expires_at: self.expires_at,
            items,
        };
        let event = OrderEvent {
            id: self.event_id,
            order_id: self.order_id,
            seq: self.seq,
            event_type: self.event_type,
            data: self.data,
            created_at: self.event_created_at,
        };
        (order, event)
    }
}

/// One request read on its own: a row that does not decode is that job's
/// permanent failure, named with Diesel's field and the value it refused.
fn read_one(
    conn: &mut PgConnection,
    order_id: OrderId,
    event_id: i64,
) -> diesel::QueryResult<Loaded> {
    let order = match load_order(conn, order_id) {
        Ok(Some(order)) => order,
        Ok(None) => return Ok(Err(gone(format!("order {order_id}")))),
        Err(diesel::result::Error::DeserializationError(e)) => {
            return Ok(Err(unreadable(format!("order {order_id}"), e.as_ref())));
        }
        Err(error) => return Err(error),
    };
    match load_event(conn, event_id) {
        Ok(Some(event)) => Ok(render(&order, &event)),
        Ok(None) => Ok(Err(gone(format!("event {event_id}")))),
        Err(diesel::result::Error::DeserializationError(e)) => {
            Ok(Err(unreadable(format!("event {event_id}"), e.as_ref())))
        }
        Err(error) => Err(error),
    }
}

/// Diesel names the field; its source names the value.
fn unreadable(
    what: String,
    error: &(dyn std::error::Error + Send + Sync + 'static),
) -> EffectError {
    EffectError::permanent(format!(
        "{what} cannot be read: {}",
        crate::effects::error_chain(error)
    ))
}

fn gone(what: String) -> EffectError {
    EffectError::permanent(format!("{what} no longer exists"))
}

fn render(order: &Order, event: &OrderEvent) -> Loaded {
    let body = event_body(order, event).map_err(|e| {
        EffectError::permanent(format!("order {} does not serialize: {e}", order.id))
    })?;
    Ok(Rendered {
        event_type: event.event_type.clone(),
        body: body.into(),
    })
}
