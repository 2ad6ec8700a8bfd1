//! The order domain: parsing an order at the edge, placing it with its jobs in one
//! transaction, and reading it back.
//!
//! Inside, [`place`](place_order) and [`transition`](transition_order) each
//! depend on `events` (an event, its `seq`, its jobs) and never on each
//! other; the jobs they queue are typed in [`jobs`]. Nothing here depends on
//! [`crate::effects`], whose workers read orders through this module.

use jobs::{ConfirmationEmail, OrderWebhook, ReceiptPdf};
use outbox_core::worker::JobArgs as _;

mod currency;
mod domain;
mod events;
mod expiry;
mod fanout;
mod id;
mod idempotency;
pub mod jobs;
mod json;
mod ledger;
mod lock;
mod place;
mod place_on;
mod read;
mod status;
mod transition;
mod transition_body;
mod validation;

pub use currency::Currency;
pub(crate) use domain::OrderBody;
pub use domain::{
    CustomerEmail, DisplayText, MAX_ITEMS, MAX_QUANTITY, MAX_UNIT_PRICE, Money, NewOrder,
    NewOrderItem, Quantity,
};
pub use events::{DEFAULT_FANOUT_INLINE, EventJobs, EventSubscribers, delivery_key, endpoint_key};
pub use expiry::{
    EXPIRY_BATCH, EXPIRY_SWEEP_EVERY, EXPIRY_SWEEP_NAME, ExpireOrders, Sweep, expire_due_orders,
};
pub use fanout::{FANOUT_BATCH, FanoutProgress, expand_fanout, expand_fanout_step};
pub use id::{EndpointId, EventId, OrderId};
pub use idempotency::{Cause, IdempotencyKey};
pub use jobs::{new_job, order_enqueuer};
pub use ledger::{
    EffectEntry, EffectLedger, load_effect_ledger, load_ledger, prune as prune_ledger,
};
pub use lock::LockedOrder;
pub(crate) use place::{PLACE_ORDER_PARAMS, PLACE_ORDER_SQL, Placing, place_with};
pub use place::{
    PlaceOrderError, Placed, PlacedOrder, Placement, place_order, place_order_by, placement_jobs,
};
pub(crate) use place_on::{
    KeyChecked, PLACE_ORDER_AS_KEY_SQL, place_order_as_key_on, place_order_as_key_params,
    place_order_on,
};
pub use read::{
    Order, OrderEvent, OrderItem, OrderJob, load_event, load_events, load_order, load_order_events,
    load_order_jobs, load_orders,
};
pub use status::OrderStatus;
pub use transition::{
    Transition, TransitionError, TransitionOutcome, transition_locked, transition_order,
    transition_order_by,
};
pub(crate) use transition_body::{CancelBody, DeliverBody, PayBody, RefundBody, ShipBody};
pub use validation::ValidationError;

/// The name of the endpoint that `WEBHOOK_URL` / `WEBHOOK_SECRET` keep, and
/// that deliveries queued without an endpoint go to.
pub const DEFAULT_ENDPOINT: &str = "default";

/// The ordering key of an order's deliveries queued without an endpoint (to
/// `default`, before any endpoint existed): one at a time, in event order.
/// The order's later deliveries to `default` take it too while any of those
/// is unfinished, so they queue behind them.
pub fn webhook_key(order_id: i64) -> String {
    format!("order-{order_id}-webhooks")
}

/// The ordering key of an order's `order_fanout` jobs: one event's fan-out
/// at a time, in event order.
pub fn fanout_key(order_id: i64) -> String {
    format!("order-{order_id}-fanout")
}

/// The ordering key of an order's emails.
pub fn email_key(order_id: i64) -> String {
    format!("order-{order_id}-emails")
}

/// The jobs every placed order gets, one per effect, in the order the
/// placement queues them (the job types' own `KIND`s).
pub const ORDER_JOB_KINDS: [&str; 3] = [
    ConfirmationEmail::KIND,
    ReceiptPdf::KIND,
    OrderWebhook::KIND,
];
