//! Typed effects behind one interface.
//!
//! The relay knows only [`Executor`]: give it a claimed job, get back success
//! (with an optional [`LocalWrite`] to commit with the completion) or an
//! [`EffectError`] that says whether to retry. [`Effects`] is the production
//! executor: it decodes the job into an [`Effect`] and dispatches on it. Tests
//! plug in executors of their own.

pub mod email;
pub mod receipt;
pub mod signature;
pub mod webhook;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;

use crate::db::{PgPool, run_blocking};
use crate::orders::{Order, OrderEvent, load_event, load_order};
use crate::outbox::{ClaimedJob, LocalWrite};

/// How an effect failed, which decides what happens to the job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EffectError {
    /// Worth another attempt (network trouble, a 5xx, a full mailbox server).
    /// `retry_after` is the receiver's own wish (an HTTP `Retry-After`); the
    /// relay waits for the later of it and its backoff.
    #[error("{message}")]
    Retryable {
        message: String,
        retry_after: Option<Duration>,
    },
    /// Retrying cannot help (a 4xx, a rejected recipient, a payload that does not
    /// decode, an order that no longer exists): the job goes straight to `failed`.
    #[error("{message}")]
    Permanent { message: String },
}

impl EffectError {
    pub fn retryable(message: impl Into<String>) -> Self {
        EffectError::Retryable {
            message: message.into(),
            retry_after: None,
        }
    }
    pub fn permanent(message: impl Into<String>) -> Self {
        EffectError::Permanent {
            message: message.into(),
        }
    }
}

/// An error and its sources on one line, each cause once (transport errors
/// often repeat their source's text in their own).
pub(crate) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
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

/// Success, possibly with a write to commit atomically with the job's completion.
pub type EffectResult = Result<Option<LocalWrite>, EffectError>;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Runs one claimed job's effect. Implementations must not panic on bad input:
/// a payload that does not decode is [`EffectError::Permanent`].
pub trait Executor: Send + Sync + 'static {
    fn execute<'a>(&'a self, job: &'a ClaimedJob) -> BoxFuture<'a, EffectResult>;
}

/// The kinds this crate knows how to perform.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EffectKind {
    ConfirmationEmail,
    ReceiptPdf,
    OrderWebhook,
    Noop,
}

impl EffectKind {
    pub const ALL: [EffectKind; 4] = [
        EffectKind::ConfirmationEmail,
        EffectKind::ReceiptPdf,
        EffectKind::OrderWebhook,
        EffectKind::Noop,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EffectKind::ConfirmationEmail => "confirmation_email",
            EffectKind::ReceiptPdf => "receipt_pdf",
            EffectKind::OrderWebhook => "order_webhook",
            EffectKind::Noop => "noop",
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
                format!(
                    "unknown job kind {s:?} (known: confirmation_email, receipt_pdf, order_webhook, noop)"
                )
            })
    }
}

impl fmt::Display for EffectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A decoded job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// The email about an order event (the confirmation for `order.placed`);
    /// no event for jobs enqueued before events existed: the confirmation.
    ConfirmationEmail {
        order_id: i64,
        event_id: Option<i64>,
    },
    ReceiptPdf {
        order_id: i64,
    },
    /// The webhook of an order event; no event: the original `order.placed` body.
    OrderWebhook {
        order_id: i64,
        event_id: Option<i64>,
    },
    Noop,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OrderPayload {
    order_id: i64,
    #[serde(default)]
    event_id: Option<i64>,
}

impl Effect {
    /// Decodes a claimed job; unknown kinds and bad payloads are permanent errors.
    pub fn decode(job: &ClaimedJob) -> Result<Effect, EffectError> {
        let kind: EffectKind = job.kind.parse().map_err(EffectError::permanent)?;
        let payload = || {
            serde_json::from_value::<OrderPayload>(job.payload.clone()).map_err(|e| {
                EffectError::permanent(format!(
                    "{kind} payload does not decode ({e}): {}",
                    job.payload
                ))
            })
        };
        Ok(match kind {
            EffectKind::ConfirmationEmail => {
                let p = payload()?;
                Effect::ConfirmationEmail {
                    order_id: p.order_id,
                    event_id: p.event_id,
                }
            }
            EffectKind::ReceiptPdf => Effect::ReceiptPdf {
                order_id: payload()?.order_id,
            },
            EffectKind::OrderWebhook => {
                let p = payload()?;
                Effect::OrderWebhook {
                    order_id: p.order_id,
                    event_id: p.event_id,
                }
            }
            EffectKind::Noop => Effect::Noop,
        })
    }
}

/// The production executor: decodes a job and performs its effect.
#[derive(Debug)]
pub struct Effects {
    pool: PgPool,
    mailer: Option<email::Mailer>,
    webhook: Option<webhook::WebhookSender>,
    receipt: receipt::ReceiptSettings,
}

impl Effects {
    /// `mailer` and `webhook` are `None` for relays that do not handle those kinds.
    pub fn new(
        pool: PgPool,
        mailer: Option<email::Mailer>,
        webhook: Option<webhook::WebhookSender>,
        receipt: receipt::ReceiptSettings,
    ) -> Self {
        Effects {
            pool,
            mailer,
            webhook,
            receipt,
        }
    }

    async fn order(&self, order_id: i64) -> Result<Order, EffectError> {
        run_blocking(&self.pool, move |conn| Ok(load_order(conn, order_id)?))
            .await
            .map_err(|e| EffectError::retryable(format!("loading order {order_id}: {e}")))?
            .ok_or_else(|| EffectError::permanent(format!("order {order_id} no longer exists")))
    }

    async fn event(&self, event_id: Option<i64>) -> Result<Option<OrderEvent>, EffectError> {
        let Some(event_id) = event_id else {
            return Ok(None);
        };
        run_blocking(&self.pool, move |conn| Ok(load_event(conn, event_id)?))
            .await
            .map_err(|e| EffectError::retryable(format!("loading event {event_id}: {e}")))?
            .map(Some)
            .ok_or_else(|| EffectError::permanent(format!("event {event_id} no longer exists")))
    }

    async fn perform(&self, job: &ClaimedJob) -> EffectResult {
        match Effect::decode(job)? {
            Effect::Noop => Ok(None),
            Effect::ConfirmationEmail { order_id, event_id } => {
                let mailer = self.mailer.as_ref().ok_or_else(|| {
                    EffectError::retryable(
                        "this relay has no SMTP_URL configured for confirmation_email",
                    )
                })?;
                let order = self.order(order_id).await?;
                let event = self.event(event_id).await?;
                let (kind, details) = match &event {
                    None => (email::EmailKind::Confirmation, serde_json::Value::Null),
                    Some(event) => (
                        email::EmailKind::for_event(&event.event_type).ok_or_else(|| {
                            EffectError::permanent(format!(
                                "{} sends no email (event {})",
                                event.event_type, event.id
                            ))
                        })?,
                        event.data.clone(),
                    ),
                };
                mailer.send(job.id, &order, kind, &details).await?;
                Ok(None)
            }
            Effect::OrderWebhook { order_id, event_id } => {
                let sender = self.webhook.as_ref().ok_or_else(|| {
                    EffectError::retryable(
                        "this relay has no WEBHOOK_URL configured for order_webhook",
                    )
                })?;
                let order = self.order(order_id).await?;
                let event = self.event(event_id).await?;
                sender.deliver(job.id, &order, event.as_ref()).await?;
                Ok(None)
            }
            Effect::ReceiptPdf { order_id } => {
                let order = self.order(order_id).await?;
                let settings = self.receipt.clone();
                // Rendering is CPU work; keep it off the async threads.
                let pdf =
                    tokio::task::spawn_blocking(move || receipt::render_receipt(&order, &settings))
                        .await
                        .map_err(|e| {
                            EffectError::retryable(format!("receipt renderer crashed: {e}"))
                        })??;
                Ok(Some(receipt::store_receipt(order_id, pdf)))
            }
        }
    }
}

impl Executor for Effects {
    fn execute<'a>(&'a self, job: &'a ClaimedJob) -> BoxFuture<'a, EffectResult> {
        Box::pin(self.perform(job))
    }
}
