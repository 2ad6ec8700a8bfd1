//! The workers of the service's job types, and the registry a relay runs.
//! Each loads what its job names (the order, its event) and performs the
//! effect; they are written with the core's [`Worker`] API, as a library
//! user's would be, and nothing in the relay knows them.

use outbox_core::worker::{EffectError, EffectResult, JobContext, Worker, Workers};
use tracing::Instrument as _;

use super::delivery::{EndpointNoticeWorker, WebhookWorker};
use super::email::{EmailKind, MAX_RECEIPT_ATTACHMENT_BYTES, Mailer};
use super::jobs::{EndpointNotice, Noop};
use super::ledger::{EffectAnswer, record_effect};
use super::nats::{NatsConnections, PublishWorker};
use super::order_loader::{OrderLoader, StoredReceipt, order_span};
use super::receipt::{self, ReceiptSettings};
use super::webhook::WebhookSender;
use crate::db::{PgPool, run_blocking};
use crate::orders::jobs::{ConfirmationEmail, OrderFanout, OrderPublish, OrderWebhook, ReceiptPdf};
use crate::orders::{FANOUT_BATCH, OrderId, expand_fanout, order_enqueuer};
use crate::sealed::Keyring;

/// The registry of the service's workers. `mailer` and `webhook` are `None`
/// for relays that do not handle those kinds; a job of such a kind that
/// reaches one anyway is retried, since the relay's configuration, not the
/// job, is what is missing. Endpoints' secrets are read as stored in
/// plaintext; a sealed one fails its delivery, naming `SECRETS_KEY`.
pub fn workers(
    pool: PgPool,
    mailer: Option<Mailer>,
    webhook: Option<WebhookSender>,
    receipt: ReceiptSettings,
) -> Workers {
    workers_with_nats(
        pool,
        mailer,
        webhook,
        receipt,
        NatsConnections::default(),
        Keyring::none(),
    )
}

/// [`workers()`], publishing to NATS over `nats` (the relay's connections,
/// with its `NATS_CREDENTIALS`), and opening the endpoints' sealed secrets
/// with `secrets` (`SECRETS_KEY`).
pub fn workers_with_nats(
    pool: PgPool,
    mailer: Option<Mailer>,
    webhook: Option<WebhookSender>,
    receipt: ReceiptSettings,
    nats: NatsConnections,
    secrets: Keyring,
) -> Workers {
    let publisher = PublishWorker::new(pool.clone(), nats, secrets.clone());
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
        .register::<EndpointNotice, _>(EndpointNoticeWorker {
            pool: orders.pool.clone(),
            sender: webhook.clone(),
            secrets: secrets.clone(),
        })
        .register::<OrderFanout, _>(FanoutWorker {
            pool: orders.pool.clone(),
        })
        .register::<OrderWebhook, _>(WebhookWorker {
            orders,
            sender: webhook,
            secrets,
        })
        .register::<OrderPublish, _>(publisher)
        .register::<Noop, _>(NoopWorker)
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
        let receipt = match kind {
            EmailKind::Confirmation => self.receipt(args.order_id, &ctx).await?,
            _ => None,
        };
        let smtp_reply = mailer
            .send_with_receipt(ctx.id(), &order, kind, &details, receipt)
            .await?;
        Ok(Some(record_effect(
            ctx.id(),
            EffectAnswer::Email {
                message_id: mailer.message_id(ctx.id()),
                smtp_reply,
            },
        )))
    }

    /// The receipt the confirmation carries, if it has one to carry. The
    /// confirmation waits for the receipt job with policy `run`: when that
    /// job failed, or the PDF is too large to mail, the email goes without
    /// it and the signed link in its body is the way to the receipt.
    async fn receipt(
        &self,
        order_id: OrderId,
        ctx: &JobContext,
    ) -> Result<Option<Vec<u8>>, EffectError> {
        if let Some(parent) = ctx.unfinished_parents().first() {
            tracing::warn!(
                receipt_job = parent,
                "the receipt job did not finish; the confirmation goes without the attachment, with the link"
            );
            return Ok(None);
        }
        let max = i64::try_from(MAX_RECEIPT_ATTACHMENT_BYTES).unwrap_or(i64::MAX);
        match self.orders.receipt(order_id, max).await? {
            StoredReceipt::Pdf(pdf) => Ok(Some(pdf)),
            StoredReceipt::TooLarge(bytes) => {
                tracing::warn!(
                    bytes,
                    max_bytes = MAX_RECEIPT_ATTACHMENT_BYTES,
                    "the receipt is larger than an email may carry; the confirmation goes with the link only"
                );
                Ok(None)
            }
            StoredReceipt::Missing => {
                // A confirmation queued without the dependency (before it
                // existed), or one whose receipt has no row for another reason.
                tracing::warn!(
                    "the order has no stored receipt; the confirmation goes with the link only"
                );
                Ok(None)
            }
        }
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

/// Writes the deliveries of an event with more subscribers than its own
/// transaction wrote ([`expand_fanout`]), a batch per transaction; a retry
/// carries on where the last attempt stopped.
#[derive(Debug)]
pub struct FanoutWorker {
    pool: PgPool,
}

impl Worker<OrderFanout> for FanoutWorker {
    async fn work(&self, args: OrderFanout, _ctx: JobContext) -> EffectResult {
        let span = order_span(args.order_id);
        let event_id = args.event_id;
        let progress = run_blocking(&self.pool, move |conn| {
            Ok(expand_fanout(conn, &order_enqueuer(), &args, FANOUT_BATCH)?)
        })
        .instrument(span)
        .await
        .map_err(|e| EffectError::retryable(format!("fanning out event {event_id}: {e}")))?;
        tracing::debug!(
            event_id,
            written = progress.written,
            total = progress.total,
            "fan-out written"
        );
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
