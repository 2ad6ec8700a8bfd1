//! The order service's effects, each a [`Worker`] on the core's typed job API
//! (the same API a library user writes their own jobs with):
//!
//! - [`jobs`]: [`EffectKind`], the kinds a relay performs, and the jobs that are not an
//!   order's ([`EndpointNotice`], [`Noop`]); an order's job types ([`ConfirmationEmail`],
//!   [`OrderEmail`], [`ReceiptPdf`], [`OrderWebhook`], [`OrderPublish`]) are in
//!   [`crate::orders::jobs`].
//!   Their `KIND`s are the names [`crate::kinds`] writes once;
//! - [`mod@workers`]: the workers that perform them, and [`workers()`], the
//!   registry a relay runs;
//! - [`email`], [`receipt`], [`webhook`], [`nats`]: what each effect does; [`signature`]:
//!   the webhook signatures; [`settings`]: what they make of the configuration;
//! - [`ledger`]: what each effect's peer answered, recorded with the job's completion.
//!
//! [`Worker`]: outbox_core::worker::Worker

pub mod delivery;
pub mod email;
pub mod jobs;
pub mod ledger;
pub mod nats;
mod order_loader;
pub mod receipt;
pub mod settings;
/// Signing is a leaf of the crate, shared with the inbox; here too, where
/// deliveries have always found it.
pub use crate::signature;
pub mod webhook;
pub mod workers;

pub use crate::orders::jobs::{
    ConfirmationEmail, OrderEmail, OrderPublish, OrderWebhook, ReceiptPdf,
};
pub use delivery::{EndpointNoticeWorker, WebhookWorker};
pub use jobs::{EffectKind, EndpointNotice, Noop};
pub use outbox_core::worker::{BoxFuture, JobHandler};
pub use outbox_core::worker::{EffectError, EffectResult, JobArgs, JobContext, Worker, Workers};
pub use workers::{
    EXPIRY_FALLBACK_EVERY, EXPIRY_FALLBACK_NAME, EmailWorker, ExpiryWorker, NoopWorker,
    PeriodicPlan, ReceiptWorker, periodic_jobs, workers, workers_with_nats,
};

/// An error and its sources on one line, each cause once (transport errors
/// often repeat their source's text in their own).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(error);
    while let Some(e) = next {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}
