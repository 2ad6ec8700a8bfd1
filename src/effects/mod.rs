//! The order service's effects, each a [`Worker`] on the core's typed job API
//! (the same API a library user writes their own jobs with):
//!
//! - [`jobs`]: the job types ([`ConfirmationEmail`], [`ReceiptPdf`],
//!   [`OrderWebhook`], [`Noop`]), whose `KIND` constants are the only place
//!   the kind names are written;
//! - [`mod@workers`]: the workers that perform them, and [`workers()`], the
//!   registry a relay runs;
//! - [`email`], [`receipt`], [`webhook`]: what each effect does; [`signature`]:
//!   the webhook signatures.
//!
//! [`Worker`]: outbox_core::worker::Worker

pub mod email;
pub mod jobs;
pub mod receipt;
pub mod signature;
pub mod webhook;
pub mod workers;

pub use jobs::{ConfirmationEmail, EffectKind, Noop, OrderWebhook, ReceiptPdf};
pub use outbox_core::worker::{
    BoxFuture, EffectError, EffectResult, Executor, JobArgs, JobContext, Worker, Workers,
    error_chain,
};
pub use workers::{EmailWorker, NoopWorker, ReceiptWorker, WebhookWorker, workers};
