//! The order domain: parsing an order at the edge, placing it with its jobs in one
//! transaction, and reading it back.

mod currency;
mod domain;
mod place;
mod read;

pub use currency::Currency;
pub use domain::{
    CustomerEmail, DisplayText, MAX_ITEMS, MAX_QUANTITY, MAX_UNIT_PRICE, Money, NewOrder,
    NewOrderItem, Quantity, ValidationError,
};
pub use place::{
    IdempotencyKey, PlaceOrderError, Placement, place_order, place_order_with_hook_for_tests,
};
pub use read::{Order, OrderItem, OrderJob, load_order, load_order_jobs};

/// The jobs every placed order gets, one per effect.
pub const ORDER_JOB_KINDS: [&str; 3] = ["confirmation_email", "receipt_pdf", "order_webhook"];
