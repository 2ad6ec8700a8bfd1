//! Payments in: signed webhooks from a payment provider, each applied to its
//! order exactly once.
//!
//! A provider (`POST /inbound/{source}`) retries for days, sends two events
//! for one Checkout payment, promises no order, and may hand one event to two
//! replicas at once. So every verified message is recorded with the core's
//! inbox ([`outbox_core::dedupe`]) in the transaction that applies it: the
//! inbox row, the order's transition, its event and its jobs commit together,
//! and a repeat changes nothing.
//!
//! - [`source`]: the senders, as rows: name, kind, secrets (`sources …`).
//! - [`source_cache`]: every source, at most [`source_cache::SOURCE_CACHE_TTL`]
//!   old, so a message is verified before it takes a database connection.
//! - [`verify`]: a message checked before the database ([`verify::check`]):
//!   the `stripe` and `standard` (Standard Webhooks) signatures, in constant
//!   time, within [`verify::TOLERANCE_SECS`] of the clock, then its JSON.
//! - [`event`]: what a provider's event means for an order: a payment, a
//!   refund, or nothing ([`event::Message`]).
//! - [`apply`]: the decision (`applied`, `held` with a reason, `unmatched`,
//!   `ignored`) on the order's row, locked once, and its one transaction,
//!   which writes the message's row once, complete.
//! - [`held`]: an operator's apply or dismiss of a held message, audited.
//! - [`list`]: the messages, for `inbox list` and the dashboard.
//! - [`retention`]: `INBOX_RETENTION`'s prune, which keeps every held
//!   message and names each unmatched payment it removes.
//! - [`reconcile`]: the events a provider's log lists that never arrived,
//!   through [`apply`] all the same (`via = reconcile`).

pub mod apply;
pub mod event;
pub mod held;
pub mod list;
pub mod reconcile;
pub mod retention;
pub mod source;
pub mod source_cache;
pub mod verify;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// How long message ids are kept (`INBOX_RETENTION`): longer than Stripe's
/// retries (3 days) and its manual resends (30 days), so a late copy is still
/// known as a repeat. Held messages are kept until decided ([`retention`]).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(35 * 86_400);

/// The largest body `/inbound/{source}` reads: far above any provider's event.
pub const MAX_INBOUND_BYTES: usize = 256 * 1024;

/// `inbox_messages.status`; the `inbox_messages_status_valid` CHECK holds the same set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageStatus {
    /// The order moved: its transition, event and jobs committed with the message.
    Applied,
    /// Kept for an operator, the order untouched; `reason` says why.
    Held,
    /// It names an order that does not exist, or an order id that is no number.
    Unmatched,
    /// Nothing to do: an event type the shop does not act on, or a payment
    /// already applied under the same reference.
    Ignored,
    /// An operator decided a held message needs nothing.
    Dismissed,
}

impl MessageStatus {
    pub const ALL: [MessageStatus; 5] = [
        MessageStatus::Applied,
        MessageStatus::Held,
        MessageStatus::Unmatched,
        MessageStatus::Ignored,
        MessageStatus::Dismissed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            MessageStatus::Applied => "applied",
            MessageStatus::Held => "held",
            MessageStatus::Unmatched => "unmatched",
            MessageStatus::Ignored => "ignored",
            MessageStatus::Dismissed => "dismissed",
        }
    }
}

impl FromStr for MessageStatus {
    type Err = String;
    fn from_str(raw: &str) -> Result<Self, String> {
        MessageStatus::ALL
            .into_iter()
            .find(|s| s.as_str() == raw)
            .ok_or_else(|| {
                format!(
                    "unknown inbox status {:?} (applied, held, unmatched, ignored, dismissed)",
                    crate::text::one_line(raw, 40)
                )
            })
    }
}

/// How a message reached the inbox (`inbox_messages.via`; the
/// `inbox_messages_via_valid` CHECK holds the same set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// Sent by the provider to `POST /inbound/{source}`, signed.
    Webhook,
    /// Listed by the provider's event log, fetched with the source's API
    /// key: never received as a webhook ([`reconcile`]).
    Reconcile,
}

impl Via {
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Webhook => "webhook",
            Via::Reconcile => "reconcile",
        }
    }
}

impl fmt::Display for Via {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for MessageStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
