//! The order domain: parsing an order at the edge, placing it with its jobs in one
//! transaction, and reading it back.

use crate::effects::EffectKind;

mod currency;
mod domain;
mod fanout;
mod json;
mod place;
mod read;
mod status;
mod transition;

pub use currency::Currency;
pub use domain::{
    CustomerEmail, DisplayText, MAX_ITEMS, MAX_QUANTITY, MAX_UNIT_PRICE, Money, NewOrder,
    NewOrderItem, Quantity, ValidationError,
};
pub use fanout::{delivery_key, endpoint_key};
pub use place::{IdempotencyKey, PlaceOrderError, Placed, PlacedOrder, Placement, place_order};
pub use read::{
    Order, OrderEvent, OrderItem, OrderJob, load_event, load_events, load_order, load_order_events,
    load_order_jobs, load_orders,
};
pub use status::OrderStatus;
pub use transition::{Transition, TransitionError, TransitionOutcome, transition_order};

/// The ordering key of an order's deliveries queued without an endpoint (to
/// `default`, before any endpoint existed): one at a time, in event order.
pub fn webhook_key(order_id: i64) -> String {
    format!("order-{order_id}-webhooks")
}

/// The ordering key of an order's emails.
pub fn email_key(order_id: i64) -> String {
    format!("order-{order_id}-emails")
}

/// The jobs every placed order gets, one per effect (the job types' own
/// `KIND`s: see [`EffectKind::ORDER`]).
pub const ORDER_JOB_KINDS: [&str; 3] = [
    EffectKind::ORDER[0].as_str(),
    EffectKind::ORDER[1].as_str(),
    EffectKind::ORDER[2].as_str(),
];
