//! The queue core's own tests, on databases that hold only its tables.

mod checkout;
mod claim_plan;
mod claims;
mod dedupe;
mod dependencies;
mod enqueue;
mod failures;
mod finish_interleavings;
mod limits;
mod outcome_writes;
mod periodic;
mod protocol_model;
mod scheduled;
mod statement_parity;
mod support;
mod worker_pool;
