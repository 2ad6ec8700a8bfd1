//! Reading an order back: the order, its items and its jobs, typed
//! ([`OrderId`], [`Currency`], [`OrderStatus`]); their JSON is the same text
//! and numbers the columns hold.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use serde::Serialize;

use super::{Currency, OrderId, OrderStatus};
use crate::schema::{jobs_all, order_events, order_items, orders};

#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = orders)]
struct OrderHeader {
    id: OrderId,
    customer_email: String,
    customer_name: String,
    currency: Currency,
    total_cents: i64,
    status: OrderStatus,
    created_at: DateTime<Utc>,
    expires_at: Option<DateTime<Utc>>,
}

impl OrderHeader {
    fn with_items(self, items: Vec<OrderItem>) -> Order {
        Order {
            id: self.id,
            customer_email: self.customer_email,
            customer_name: self.customer_name,
            currency: self.currency,
            total_cents: self.total_cents,
            status: self.status,
            created_at: self.created_at,
            expires_at: self.expires_at,
            items,
        }
    }
}

#[derive(Debug, Clone, Queryable, Selectable, Serialize, utoipa::ToSchema)]
#[diesel(table_name = order_items)]
pub struct OrderItem {
    #[serde(skip)]
    pub id: i64,
    pub sku: String,
    pub name: String,
    pub quantity: i32,
    pub unit_price_cents: i64,
}

impl OrderItem {
    pub fn line_total_cents(&self) -> i64 {
        i64::from(self.quantity).saturating_mul(self.unit_price_cents)
    }
}

/// A job as shown with its order. Without `last_error`: it quotes receivers
/// and SMTP servers, which is for operators (`/admin`, `jobs list`), not
/// for API clients.
#[derive(Debug, Clone, Queryable, Selectable, Serialize, utoipa::ToSchema)]
#[diesel(table_name = jobs_all)]
pub struct OrderJob {
    pub id: i64,
    pub kind: String,
    pub status: String,
    pub attempts: i32,
    pub max_attempts: i32,
    pub run_after: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// An order with its items, as effects and the API see it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Order {
    #[schema(value_type = i64)]
    pub id: OrderId,
    pub customer_email: String,
    pub customer_name: String,
    #[schema(value_type = String, example = "EUR")]
    pub currency: Currency,
    pub total_cents: i64,
    pub status: OrderStatus,
    pub created_at: DateTime<Utc>,
    /// When the order expires unless paid: set while it is `placed` under a
    /// payment window (`ORDER_PAYMENT_WINDOW`), null otherwise.
    #[schema(required = true)]
    pub expires_at: Option<DateTime<Utc>>,
    pub items: Vec<OrderItem>,
}

/// One step of an order's history.
#[derive(Debug, Clone, Queryable, Selectable, Serialize, utoipa::ToSchema)]
#[diesel(table_name = order_events)]
pub struct OrderEvent {
    pub id: i64,
    #[serde(skip)]
    #[schema(ignore)]
    pub order_id: OrderId,
    /// 1, 2, ... per order, in commit order.
    pub seq: i32,
    #[serde(rename = "type")]
    pub event_type: String,
    #[schema(value_type = Object)]
    pub data: serde_json::Value,
    pub created_at: DateTime<Utc>,
}

/// Loads an order and its items; `None` when no such order exists.
pub fn load_order(conn: &mut PgConnection, order_id: OrderId) -> QueryResult<Option<Order>> {
    let Some(header) = orders::table
        .find(order_id)
        .select(OrderHeader::as_select())
        .first(conn)
        .optional()?
    else {
        return Ok(None);
    };
    let items = order_items::table
        .filter(order_items::order_id.eq(order_id))
        .order(order_items::id)
        .select(OrderItem::as_select())
        .load(conn)?;
    Ok(Some(header.with_items(items)))
}

/// An order's events, in `seq` order.
pub fn load_order_events(
    conn: &mut PgConnection,
    order_id: OrderId,
) -> QueryResult<Vec<OrderEvent>> {
    order_events::table
        .filter(order_events::order_id.eq(order_id))
        .order(order_events::seq)
        .select(OrderEvent::as_select())
        .load(conn)
}

/// One event; `None` when it does not exist.
pub fn load_event(conn: &mut PgConnection, event_id: i64) -> QueryResult<Option<OrderEvent>> {
    order_events::table
        .find(event_id)
        .select(OrderEvent::as_select())
        .first(conn)
        .optional()
}

/// The jobs of one order, oldest first, wherever they live: `jobs_all` is
/// `jobs` (found through jobs_order_id_idx) and the archive of done jobs
/// (jobs_done_order_id_brin in each partition: a few page ranges).
pub fn load_order_jobs(conn: &mut PgConnection, order_id: OrderId) -> QueryResult<Vec<OrderJob>> {
    jobs_all::table
        .filter(jobs_all::order_id.eq(order_id))
        .order(jobs_all::id)
        .select(OrderJob::as_select())
        .load(conn)
}

/// Loads many orders with their items, in two statements whatever their
/// number: a relay publishing a claimed batch of events reads their orders
/// together instead of two round trips per event. Orders that do not exist
/// are missing from the map.
pub fn load_orders(
    conn: &mut PgConnection,
    order_ids: &[OrderId],
) -> QueryResult<HashMap<OrderId, Order>> {
    let headers: Vec<OrderHeader> = orders::table
        .filter(orders::id.eq_any(order_ids))
        .select(OrderHeader::as_select())
        .load(conn)?;
    let items: Vec<(OrderId, OrderItem)> = order_items::table
        .filter(order_items::order_id.eq_any(order_ids))
        .order((order_items::order_id, order_items::id))
        .select((order_items::order_id, OrderItem::as_select()))
        .load(conn)?;
    let mut found: HashMap<OrderId, Order> = headers
        .into_iter()
        .map(|header| (header.id, header.with_items(Vec::new())))
        .collect();
    for (order_id, item) in items {
        if let Some(order) = found.get_mut(&order_id) {
            order.items.push(item);
        }
    }
    Ok(found)
}

/// Loads many events in one statement; those that do not exist are missing
/// from the map.
pub fn load_events(
    conn: &mut PgConnection,
    event_ids: &[i64],
) -> QueryResult<HashMap<i64, OrderEvent>> {
    Ok(order_events::table
        .filter(order_events::id.eq_any(event_ids))
        .select(OrderEvent::as_select())
        .load::<OrderEvent>(conn)?
        .into_iter()
        .map(|event| (event.id, event))
        .collect())
}
