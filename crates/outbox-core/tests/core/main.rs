//! The queue core's own tests, on databases that hold only its tables.

mod dependencies;
mod enqueue;
mod failures;
mod inbox;
mod limits;
mod protocol_model;
mod relay;
mod support;
