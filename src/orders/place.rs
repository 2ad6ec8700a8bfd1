//! `place_order`: the order, its items and its jobs in ONE transaction.

use diesel::prelude::*;
use diesel::result::Error as DieselError;
use sha2::{Digest, Sha256};

use super::domain::NewOrder;
use super::transition::{event_email, event_webhook, record_event};
use super::{ORDER_JOB_KINDS, OrderStatus};
use crate::outbox::{self, DEFAULT_MAX_ATTEMPTS, NewJob};
use crate::schema::{order_items, orders};

/// A client-chosen key that makes `POST /orders` safe to retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub const MAX_LEN: usize = 255;

    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.is_empty() || raw.len() > Self::MAX_LEN {
            return Err(format!("must be 1 to {} bytes", Self::MAX_LEN));
        }
        if !raw.chars().all(|c| c.is_ascii_graphic()) {
            return Err("must be printable ASCII without spaces".into());
        }
        Ok(IdempotencyKey(raw.to_owned()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

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

#[derive(Debug, thiserror::Error)]
pub enum PlaceOrderError {
    #[error("idempotency key already used for a different order (order {existing_order_id})")]
    IdempotencyConflict { existing_order_id: i64 },
    #[error(transparent)]
    Database(#[from] DieselError),
}

#[derive(Insertable)]
#[diesel(table_name = orders)]
struct OrderRow<'a> {
    customer_email: &'a str,
    customer_name: &'a str,
    currency: &'a str,
    total_cents: i64,
    idempotency_key: Option<&'a str>,
    request_hash: Option<&'a str>,
}

#[derive(Insertable)]
#[diesel(table_name = order_items)]
struct ItemRow<'a> {
    order_id: i64,
    sku: &'a str,
    name: &'a str,
    quantity: i32,
    unit_price_cents: i64,
}

/// Writes the order, its items and one job per effect in one transaction, and
/// notifies the relay in that same transaction (PostgreSQL delivers the NOTIFY
/// only on commit, so a relay never wakes for an order it cannot see yet).
///
/// With an idempotency key, a repeat of the same order returns
/// [`Placement::Existing`]; the unique constraint on the key, not a prior check,
/// decides who wins when requests race.
pub fn place_order(
    conn: &mut PgConnection,
    order: &NewOrder,
    key: Option<&IdempotencyKey>,
    max_attempts: i32,
) -> Result<Placement, PlaceOrderError> {
    place_order_with_hook(conn, order, key, max_attempts, None, |_| Ok(()))
}

/// [`place_order`] without a NOTIFY in the transaction: `waker` wakes the
/// relays once it has committed. What the API does: a NOTIFY in every
/// placement serialises all commits on PostgreSQL's notify lock
/// ([`outbox::Waker`] says why and by how much).
pub fn place_order_waking(
    conn: &mut PgConnection,
    order: &NewOrder,
    key: Option<&IdempotencyKey>,
    max_attempts: i32,
    waker: &outbox::Waker,
) -> Result<Placement, PlaceOrderError> {
    place_order_with_hook(conn, order, key, max_attempts, Some(waker), |_| Ok(()))
}

/// [`place_order`] with a hook that runs right after the order row is inserted,
/// inside the transaction, so tests can inject a failure half-way.
#[doc(hidden)]
pub fn place_order_with_hook_for_tests(
    conn: &mut PgConnection,
    order: &NewOrder,
    after_order_insert: impl FnOnce(&mut PgConnection) -> Result<(), DieselError>,
) -> Result<Placement, PlaceOrderError> {
    place_order_with_hook(
        conn,
        order,
        None,
        DEFAULT_MAX_ATTEMPTS,
        None,
        after_order_insert,
    )
}

fn place_order_with_hook(
    conn: &mut PgConnection,
    order: &NewOrder,
    key: Option<&IdempotencyKey>,
    max_attempts: i32,
    waker: Option<&outbox::Waker>,
    after_order_insert: impl FnOnce(&mut PgConnection) -> Result<(), DieselError>,
) -> Result<Placement, PlaceOrderError> {
    // The parent of every job this order enqueues (NewJob takes the current
    // span's trace context), so its effects hang under the placement.
    let span = tracing::info_span!("place_order", order_id = tracing::field::Empty);
    let _entered = span.enter();
    let fingerprint = key.map(|_| fingerprint(order));
    let placement = conn.transaction(|conn| {
        let inserted: Option<i64> = diesel::insert_into(orders::table)
            .values(OrderRow {
                customer_email: order.customer_email.as_str(),
                customer_name: order.customer_name.as_str(),
                currency: order.currency.code(),
                total_cents: order.total().cents(),
                idempotency_key: key.map(IdempotencyKey::as_str),
                request_hash: fingerprint.as_deref(),
            })
            .on_conflict(orders::idempotency_key)
            .do_nothing()
            .returning(orders::id)
            .get_result(conn)
            .optional()?;

        let Some(order_id) = inserted else {
            // The key exists: a concurrent or earlier request won. ON CONFLICT waited
            // for its transaction, so the row is visible now.
            let key = key.map(IdempotencyKey::as_str).unwrap_or_default();
            let (existing_id, existing_hash): (i64, Option<String>) = orders::table
                .filter(orders::idempotency_key.eq(key))
                .select((orders::id, orders::request_hash))
                .first(conn)?;
            return if existing_hash == fingerprint {
                Ok(Placement::Existing(existing_id))
            } else {
                Err(PlaceOrderError::IdempotencyConflict {
                    existing_order_id: existing_id,
                })
            };
        };

        span.record("order_id", order_id);
        after_order_insert(conn)?;

        let items: Vec<ItemRow<'_>> = order
            .items
            .iter()
            .map(|item| ItemRow {
                order_id,
                sku: item.sku.as_str(),
                name: item.name.as_str(),
                quantity: item.quantity.get(),
                unit_price_cents: item.unit_price.cents(),
            })
            .collect();
        diesel::insert_into(order_items::table)
            .values(&items)
            .execute(conn)?;

        // The order's first event; its webhook and email open the order's
        // ordering keys, so later events are delivered after them.
        let event_id = record_event(
            conn,
            order_id,
            1,
            OrderStatus::Placed.event_type(),
            serde_json::json!({}),
            None,
            None,
        )?;
        let jobs = vec![
            event_email(order_id, event_id, max_attempts),
            NewJob::new("receipt_pdf", serde_json::json!({ "order_id": order_id }))
                .order_id(order_id)
                .max_attempts(max_attempts),
            event_webhook(order_id, event_id, max_attempts),
        ];
        debug_assert!(
            jobs.iter()
                .map(NewJob::kind)
                .eq(ORDER_JOB_KINDS.iter().copied())
        );
        // The keys are named after this order, which nobody else can see yet.
        outbox::enqueue_many_with_new_keys_unnotified(conn, &jobs)?;
        if waker.is_none() {
            outbox::notify(conn, ORDER_JOB_KINDS.iter().copied())?;
        }
        Ok(Placement::Created(order_id))
    })?;
    if let (Some(waker), Placement::Created(_)) = (waker, &placement) {
        waker.wake(ORDER_JOB_KINDS.iter().copied());
    }
    Ok(placement)
}

/// SHA-256 of the parsed order, so the same order sent with different JSON
/// spacing or key order counts as the same request.
fn fingerprint(order: &NewOrder) -> String {
    let canonical = serde_json::json!({
        "customer_email": order.customer_email.as_str(),
        "customer_name": order.customer_name.as_str(),
        "currency": order.currency.code(),
        "items": order.items.iter().map(|i| serde_json::json!([
            i.sku.as_str(), i.name.as_str(), i.quantity.get(), i.unit_price.cents()
        ])).collect::<Vec<_>>(),
    });
    hex::encode(Sha256::digest(canonical.to_string().as_bytes()))
}
