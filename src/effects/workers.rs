//! The workers of the service's job types, and the registry a relay runs.
//! Each loads what its job names (the order, its event) and performs the
//! effect; they are written with the core's [`Worker`] API, as a library
//! user's would be, and nothing in the relay knows them.

use std::time::Duration;

use outbox_core::worker::{EffectError, EffectResult, JobContext, Worker, Workers};
use tracing::Instrument as _;

use super::email::{EmailKind, Mailer};
use super::jobs::{ConfirmationEmail, Noop, OrderWebhook, ReceiptPdf};
use super::receipt::{self, ReceiptSettings};
use super::webhook::{Secrets, WebhookSender};
use crate::db::{PgPool, run_blocking};
use crate::endpoints::{self, attempts::NewAttempt};
use crate::orders::{Order, OrderEvent, load_event, load_order};

/// The registry of the service's workers. `mailer` and `webhook` are `None`
/// for relays that do not handle those kinds; a job of such a kind that
/// reaches one anyway is retried, since the relay's configuration, not the
/// job, is what is missing.
pub fn workers(
    pool: PgPool,
    mailer: Option<Mailer>,
    webhook: Option<WebhookSender>,
    receipt: ReceiptSettings,
) -> Workers {
    let orders = OrderLoader { pool };
    Workers::new()
        .register::<ConfirmationEmail, _>(EmailWorker {
            orders: orders.clone(),
            mailer,
        })
        .register::<ReceiptPdf, _>(ReceiptWorker {
            orders: orders.clone(),
            settings: receipt,
        })
        .register::<OrderWebhook, _>(WebhookWorker {
            orders,
            sender: webhook,
        })
        .register::<Noop, _>(NoopWorker)
}

/// The span an order job's worker runs in, inside the relay's `job` span, so
/// that its log lines name the order.
fn order_span(order_id: i64) -> tracing::Span {
    tracing::info_span!("order_job", order_id)
}

/// Reads what an order job names, with the error classes a worker needs: a
/// database that does not answer is worth a retry, a row that is gone is not.
#[derive(Debug, Clone)]
struct OrderLoader {
    pool: PgPool,
}

impl OrderLoader {
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
}

/// Sends the email of an order event over SMTP.
#[derive(Debug)]
pub struct EmailWorker {
    orders: OrderLoader,
    mailer: Option<Mailer>,
}

impl Worker<ConfirmationEmail> for EmailWorker {
    async fn work(&self, args: ConfirmationEmail, ctx: JobContext) -> EffectResult {
        let span = order_span(args.order_id);
        self.send(args, ctx).instrument(span).await
    }
}

impl EmailWorker {
    async fn send(&self, args: ConfirmationEmail, ctx: JobContext) -> EffectResult {
        let mailer = self.mailer.as_ref().ok_or_else(|| {
            EffectError::retryable("this relay has no SMTP_URL configured for confirmation_email")
        })?;
        let order = self.orders.order(args.order_id).await?;
        let event = self.orders.event(args.event_id).await?;
        let (kind, details) = match &event {
            None => (EmailKind::Confirmation, serde_json::Value::Null),
            Some(event) => (
                EmailKind::for_event(&event.event_type).ok_or_else(|| {
                    EffectError::permanent(format!(
                        "{} sends no email (event {})",
                        event.event_type, event.id
                    ))
                })?,
                event.data.clone(),
            ),
        };
        mailer.send(ctx.id(), &order, kind, &details).await?;
        Ok(None)
    }
}

/// Renders an order's PDF receipt and stores it in the transaction that
/// completes the job, so it exists exactly once.
#[derive(Debug)]
pub struct ReceiptWorker {
    orders: OrderLoader,
    settings: ReceiptSettings,
}

impl Worker<ReceiptPdf> for ReceiptWorker {
    async fn work(&self, args: ReceiptPdf, _ctx: JobContext) -> EffectResult {
        let span = order_span(args.order_id);
        self.render(args).instrument(span).await
    }
}

impl ReceiptWorker {
    async fn render(&self, args: ReceiptPdf) -> EffectResult {
        let order = self.orders.order(args.order_id).await?;
        let settings = self.settings.clone();
        // Rendering is CPU work; keep it off the async threads.
        let pdf = tokio::task::spawn_blocking(move || receipt::render_receipt(&order, &settings))
            .await
            .map_err(|e| EffectError::retryable(format!("receipt renderer crashed: {e}")))??;
        Ok(Some(receipt::store_receipt(args.order_id, pdf)))
    }
}

/// Delivers an order event to its endpoint, signed with that endpoint's
/// secrets, and logs the attempt in `delivery_attempts`.
#[derive(Debug)]
pub struct WebhookWorker {
    orders: OrderLoader,
    sender: Option<WebhookSender>,
}

impl Worker<OrderWebhook> for WebhookWorker {
    async fn work(&self, args: OrderWebhook, ctx: JobContext) -> EffectResult {
        let span = order_span(args.order_id);
        self.deliver(args, ctx).instrument(span).await
    }
}

/// How long a delivery claimed for a disabled endpoint waits before it is
/// tried again (the endpoint's paused key normally keeps it unclaimed).
const DISABLED_RETRY: Duration = Duration::from_secs(60);

impl WebhookWorker {
    async fn deliver(&self, args: OrderWebhook, ctx: JobContext) -> EffectResult {
        let sender = self.sender.as_ref().ok_or_else(|| {
            EffectError::retryable("this relay has no WEBHOOK_URL configured for order_webhook")
        })?;
        let order = self.orders.order(args.order_id).await?;
        let event = self.orders.event(args.event_id).await?;
        let endpoint_id = args.endpoint_id;
        let target = run_blocking(&self.orders.pool, move |conn| {
            Ok(endpoints::target::load(conn, endpoint_id)?)
        })
        .await
        .map_err(|e| EffectError::retryable(format!("loading the endpoint: {e}")))?;
        let Some(target) = target else {
            return match endpoint_id {
                // A database where no relay has written `default` yet: this
                // relay's own WEBHOOK_URL is what `default` would be.
                None => {
                    sender.deliver(ctx.id(), &order, event.as_ref()).await?;
                    Ok(None)
                }
                Some(id) => Err(EffectError::permanent(format!(
                    "endpoint {id} no longer exists (removed)"
                ))),
            };
        };
        if !target.enabled {
            return Err(EffectError::Retryable {
                message: format!(
                    "endpoint {:?} is disabled; the delivery waits until it is enabled",
                    target.name
                ),
                retry_after: Some(DISABLED_RETRY),
            });
        }
        let url = url::Url::parse(&target.url).map_err(|e| {
            EffectError::permanent(format!("endpoint {:?} has a bad URL: {e}", target.name))
        })?;
        let secrets = Secrets::parse(&target.signing_secrets()).map_err(|e| {
            EffectError::permanent(format!("endpoint {:?} has a bad secret: {e}", target.name))
        })?;
        let started_at = chrono::Utc::now();
        let outcome = sender
            .deliver_to(&url, &secrets, ctx.id(), &order, event.as_ref())
            .await;
        let attempt = NewAttempt {
            job_id: ctx.id(),
            endpoint_id: target.id,
            attempt: ctx.attempt(),
            started_at,
            duration: outcome.duration,
            status_code: outcome.status,
            outcome: match &outcome.result {
                Ok(()) => "ok",
                Err(EffectError::Retryable { .. }) => "retryable",
                Err(EffectError::Permanent { .. }) => "permanent",
            },
            excerpt: match &outcome.result {
                Err(e) if outcome.status.is_none() => Some(e.to_string()),
                _ => outcome.excerpt.clone(),
            },
        };
        let logged = run_blocking(&self.orders.pool, move |conn| {
            Ok(endpoints::attempts::record(conn, &attempt)?)
        })
        .await;
        if let Err(error) = logged {
            // The call happened either way; a lost log row must not repeat it.
            tracing::warn!(endpoint = %target.name, %error, "cannot log the delivery attempt");
        }
        outcome.result?;
        Ok(None)
    }
}

/// Succeeds at once.
#[derive(Debug)]
pub struct NoopWorker;

impl Worker<Noop> for NoopWorker {
    async fn work(&self, _args: Noop, _ctx: JobContext) -> EffectResult {
        Ok(None)
    }
}
