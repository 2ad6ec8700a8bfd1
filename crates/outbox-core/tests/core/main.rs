//! The queue core's own tests, on databases that hold only its tables.

mod dedupe;
mod dependencies;
mod enqueue;
mod failures;
mod limits;
mod periodic;
mod protocol_model;
mod worker_pool;
mod scheduled;
mod statement_parity;
mod support;
