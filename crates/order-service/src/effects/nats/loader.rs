//! Reads the orders and events of publish jobs together, and renders each
//! job's body where it was read: the jobs of one
//! claim start at the same moment, and each would otherwise spend three
//! database round trips (order, items, event) before its publish: several
//! times what the publish and its PubAck take (docs/performance.md, "A
//! publish job's own CPU").
//!
//! Each job sends its `(order, event)` to one loader task and awaits the
//! answer (a `MicroBatcher`). The loader reads every request waiting at
//! that moment in three statements on one pooled connection; requests
//! arriving meanwhile form the next batch.
//!
//! One row that does not decode (a currency code this build does not know)
//! fails the statement that read it, and so the whole batch: the batch is
//! then read again one request at a time, so that only that order's job
//! fails, permanently and saying why, as the other order jobs'
//! `OrderLoader` does.
//!
//! A job gets its body, not the order: rendering it from the rows the batch
//! read saves copying each order, its items and its event for the job, and
//! rendering it again from the copies.

use std::collections::HashMap;

use outbox_core::worker::EffectError;

use diesel::PgConnection;

use super::micro_batch::{Batch, Lost, MicroBatcher};
use crate::db::{PgPool, run_blocking};
use crate::effects::webhook::body::event_body;
use crate::orders::{
    EventId, Order, OrderEvent, OrderId, load_event, load_events, load_order, load_orders,
};

/// What a publish needs of its order and event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// The event's type (`order.paid`), for the subject.
    pub event_type: String,
    /// The webhook body of the order and event, as published.
    pub body: Vec<u8>,
}

type Loaded = Result<Rendered, EffectError>;

/// Loads `(order, event)` pairs in batches. Cloning shares the loader.
#[derive(Debug, Clone)]
pub struct BatchLoader(MicroBatcher<Reader>);

impl BatchLoader {
    pub fn new(pool: PgPool) -> BatchLoader {
        BatchLoader(MicroBatcher::new(Reader { pool }))
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

/// Three statements a batch, on one pooled connection.
#[derive(Debug)]
struct Reader {
    pool: PgPool,
}

impl Batch for Reader {
    type Request = (OrderId, i64);
    type Answer = Loaded;
    /// Most requests read in one batch.
    const MAX_BATCH: usize = 256;
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
    let order_ids: Vec<OrderId> = wanted.iter().map(|(order, _)| *order).collect();
    let event_ids: Vec<i64> = wanted.iter().map(|(_, event)| *event).collect();
    let together = load_orders(conn, &order_ids)
        .and_then(|orders| Ok((orders, load_events(conn, &event_ids)?)));
    match together {
        Ok((orders, events)) => Ok(wanted
            .iter()
            .map(|&(order_id, event_id)| pick(&orders, &events, order_id, event_id))
            .collect()),
        Err(diesel::result::Error::DeserializationError(_)) => wanted
            .iter()
            .map(|&(order_id, event_id)| read_one(conn, order_id, event_id))
            .collect(),
        Err(error) => Err(error),
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

fn pick(
    orders: &HashMap<OrderId, Order>,
    events: &HashMap<i64, OrderEvent>,
    order_id: OrderId,
    event_id: i64,
) -> Loaded {
    let order = orders
        .get(&order_id)
        .ok_or_else(|| gone(format!("order {order_id}")))?;
    let event = events
        .get(&event_id)
        .ok_or_else(|| gone(format!("event {event_id}")))?;
    render(order, event)
}

fn render(order: &Order, event: &OrderEvent) -> Loaded {
    let body = event_body(order, event).map_err(|e| {
        EffectError::permanent(format!("order {} does not serialize: {e}", order.id))
    })?;
    Ok(Rendered {
        event_type: event.event_type.clone(),
        body,
    })
}
