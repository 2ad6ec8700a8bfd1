//! The kinds this service performs ([`EffectKind`]), and the job types that
//! are not an order's (those are in [`crate::orders::jobs`]).

use std::fmt;
use std::str::FromStr;

use outbox_core::worker::JobArgs;
use serde::{Deserialize, Serialize};

pub use crate::endpoints::notice::EndpointNotice;
use crate::orders::jobs::{ConfirmationEmail, OrderPublish, OrderWebhook, ReceiptPdf};

/// Succeeds at once, whatever it carries (benchmarks, smoke tests).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Noop(pub serde_json::Value);

impl JobArgs for Noop {
    const KIND: &'static str = "noop";
}

/// The kinds this service performs: what `--kinds` accepts and what a relay
/// claims by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EffectKind {
    /// [`ConfirmationEmail`].
    ConfirmationEmail,
    /// [`ReceiptPdf`].
    ReceiptPdf,
    /// [`OrderWebhook`].
    OrderWebhook,
    /// [`EndpointNotice`].
    EndpointNotice,
    /// [`OrderPublish`].
    OrderPublish,
    /// [`Noop`].
    Noop,
}

impl EffectKind {
    /// Every kind, in the order the CLI lists them.
    pub const ALL: [EffectKind; 6] = [
        EffectKind::ConfirmationEmail,
        EffectKind::ReceiptPdf,
        EffectKind::OrderWebhook,
        EffectKind::EndpointNotice,
        EffectKind::OrderPublish,
        EffectKind::Noop,
    ];

    /// The kinds an order placement enqueues, one job each, in this order.
    pub const ORDER: [EffectKind; 3] = [
        EffectKind::ConfirmationEmail,
        EffectKind::ReceiptPdf,
        EffectKind::OrderWebhook,
    ];

    /// The name in `jobs.kind`: its job type's `KIND`.
    pub const fn as_str(self) -> &'static str {
        match self {
            EffectKind::ConfirmationEmail => ConfirmationEmail::KIND,
            EffectKind::ReceiptPdf => ReceiptPdf::KIND,
            EffectKind::OrderWebhook => OrderWebhook::KIND,
            EffectKind::EndpointNotice => EndpointNotice::KIND,
            EffectKind::OrderPublish => OrderPublish::KIND,
            EffectKind::Noop => Noop::KIND,
        }
    }
}

impl FromStr for EffectKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EffectKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                let known: Vec<&str> = EffectKind::ALL.iter().map(|k| k.as_str()).collect();
                format!("unknown job kind {s:?} (known: {})", known.join(", "))
            })
    }
}

impl fmt::Display for EffectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_kinds_are_the_placements_jobs() {
        assert_eq!(
            EffectKind::ORDER.map(EffectKind::as_str),
            crate::orders::ORDER_JOB_KINDS
        );
    }
}
