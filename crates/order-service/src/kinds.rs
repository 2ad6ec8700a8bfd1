//! The kinds of job this service performs, by the name `jobs.kind` holds:
//! what `RELAY_KINDS` accepts and what a relay claims by default. Each name is
//! written here once; every job type's `KIND` is its kind's [`EffectKind::as_str`],
//! so the configuration and the jobs cannot name a kind differently.

use std::fmt;
use std::str::FromStr;

/// The kinds this service performs, each with its job type (in `orders::jobs`,
/// `orders::expiry`, `effects::jobs`, `endpoints::notice` and `inbox::reconcile::job`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EffectKind {
    /// `ConfirmationEmail`: the confirmation of a placed order (and, for a
    /// job queued before `order_email` existed, the email of any event).
    ConfirmationEmail,
    /// `OrderEmail`: the email of an order's later event (shipped,
    /// cancelled, refunded, expired).
    OrderEmail,
    /// `ReceiptPdf`: an order's receipt.
    ReceiptPdf,
    /// `OrderWebhook`: an order's event to an HTTP endpoint.
    OrderWebhook,
    /// `EndpointNotice`: an endpoint told about the endpoints themselves.
    EndpointNotice,
    /// `OrderPublish`: an order's event to a NATS endpoint.
    OrderPublish,
    /// `OrderFanout`: an order's event to more endpoints than its own
    /// transaction writes deliveries for.
    OrderFanout,
    /// `Noop`: succeeds at once (benchmarks, smoke tests).
    Noop,
    /// `ExpireOrders`: the periodic sweep that expires unpaid orders.
    OrderExpiry,
    /// `InboxReconcile`: the provider's event log against the inbox.
    InboxReconcile,
}

impl EffectKind {
    /// Every kind, in the order the CLI lists them.
    pub const ALL: [EffectKind; 10] = [
        EffectKind::ConfirmationEmail,
        EffectKind::OrderEmail,
        EffectKind::ReceiptPdf,
        EffectKind::OrderWebhook,
        EffectKind::EndpointNotice,
        EffectKind::OrderPublish,
        EffectKind::OrderFanout,
        EffectKind::Noop,
        EffectKind::OrderExpiry,
        EffectKind::InboxReconcile,
    ];

    /// The kinds an order placement enqueues, one job each, in this order.
    pub const ORDER: [EffectKind; 3] = [
        EffectKind::ConfirmationEmail,
        EffectKind::ReceiptPdf,
        EffectKind::OrderWebhook,
    ];

    /// The name in `jobs.kind`.
    pub const fn as_str(self) -> &'static str {
        match self {
            EffectKind::ConfirmationEmail => "confirmation_email",
            EffectKind::OrderEmail => "order_email",
            EffectKind::ReceiptPdf => "receipt_pdf",
            EffectKind::OrderWebhook => "order_webhook",
            EffectKind::EndpointNotice => "endpoint_notice",
            EffectKind::OrderPublish => "order_publish",
            EffectKind::OrderFanout => "order_fanout",
            EffectKind::Noop => "noop",
            EffectKind::OrderExpiry => "order_expiry",
            EffectKind::InboxReconcile => "inbox_reconcile",
        }
    }

    /// The kinds that send email, which need `SMTP_URL` and `MAIL_FROM`.
    pub const EMAIL: [EffectKind; 2] = [EffectKind::ConfirmationEmail, EffectKind::OrderEmail];

    /// Whether jobs of this kind send email.
    pub fn sends_email(self) -> bool {
        EffectKind::EMAIL.contains(&self)
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
