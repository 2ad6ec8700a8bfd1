//! The workers of the service's job types, the registry a relay runs, and
//! the periodic jobs it declares ([`periodic_jobs`]).
//! Each loads what its job names (the order, its event) and performs the
//! effect; they are written with the core's [`Worker`] API, as a library
//! user's would be, and nothing in the relay knows them.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::outbox::{InvalidPeriodicJob, JobOptions, PeriodicJob};
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
use crate::kinds::EffectKind;
use crate::orders::jobs::{
    ConfirmationEmail, OrderEmail, OrderFanout, OrderPublish, OrderWebhook, ReceiptPdf,
};
use crate::orders::{
    EXPIRY_BATCH, EXPIRY_SWEEP_EVERY, EXPIRY_SWEEP_NAME, EventId, ExpireOrders, FANOUT_BATCH,
    OrderId, expand_fanout, expire_due_orders, order_enqueuer,
};
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
    let expiry = ExpiryWorker { pool: pool.clone() };
    let orders = OrderLoader { pool };
    let email = EmailWorker {
        orders: orders.clone(),
        mailer: mailer.map(Arc::new),
    };
    Workers::new()
        .register::<ConfirmationEmail, _>(email.clone())
        .register::<OrderEmail, _>(email)
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
        .register::<ExpireOrders, _>(expiry)
}

/// Sends the email of an order event over SMTP: the confirmation
/// (`confirmation_email`) and every later event's (`order_email`). Which
/// email follows the event the job names, not its kind, so a
/// `confirmation_email` job queued for a later event sends that event's.
#[derive(Debug, Clone)]
pub struct EmailWorker {
    orders: OrderLoader,
    mailer: Option<Arc<Mailer>>,
}

impl Worker<ConfirmationEmail> for EmailWorker {
    async fn work(&self, args: ConfirmationEmail, ctx: JobContext) -> EffectResult {
        let span = order_span(args.order_id);
        self.send(args.order_id, EventId::new(args.event_id), ctx)
            .instrument(span)
            .await
    }
}

impl Worker<OrderEmail> for EmailWorker {
    async fn work(&self, args: OrderEmail, ctx: JobContext) -> EffectResult {
        let span = order_span(args.order_id);
        self.send(args.order_id, EventId::new(args.event_id), ctx)
            .instrument(span)
            .await
    }
}

impl EmailWorker {
    async fn send(&self, order_id: OrderId, event_id: EventId, ctx: JobContext) -> EffectResult {
        let mailer = self.mailer.as_ref().ok_or_else(|| {
            EffectError::retryable(format!(
                "this relay has no SMTP_URL configured for {}",
                ctx.kind()
            ))
        })?;
        let order = self.orders.order(order_id).await?;
        let event = self.orders.event(event_id).await?;
        let kind = EmailKind::for_event(&event.event_type).ok_or_else(|| {
            EffectError::permanent(format!(
                "{} sends no email (event {})",
                event.event_type, event.id
            ))
        })?;
        let details = event.data;
        let receipt = match kind {
            EmailKind::Confirmation => self.receipt(order_id, &ctx).await?,
            _ => None,
        };
        let smtp_reply = mailer
            .send_with_receipt(ctx.id(), &order, kind, &details, receipt)
            .await?;
        Ok(Some(record_effect(
            ctx.id(),
            EffectAnswer::Email {
                message_id: mailer.message_id(ctx.id(), kind),
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

/// order_expiry: the relays' periodic sweep that expires unpaid orders
/// ([`expire_due_orders`]), each in its own transaction. A run with nothing
/// due costs one index probe.
#[derive(Debug, Clone)]
pub struct ExpiryWorker {
    pub pool: PgPool,
}

impl Worker<ExpireOrders> for ExpiryWorker {
    async fn work(&self, args: ExpireOrders, _ctx: JobContext) -> EffectResult {
        let fallback = args.fallback;
        let jobs = crate::orders::EventJobs {
            max_attempts: args.max_attempts,
            fanout_inline: args.fanout_inline,
        };
        let swept = run_blocking(&self.pool, move |conn| {
            Ok(expire_due_orders(
                conn,
                &order_enqueuer(),
                jobs,
                EXPIRY_BATCH,
            ))
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|swept| swept.map_err(|e| e.to_string()));
        // The sweep ends done even when it failed: its schedule is its retry
        // (the next slot sweeps again), so a lasting failure (the database
        // away, an order that cannot be expired) is a WARN a slot and a
        // metric, not a failed job a slot.
        let sweep = match swept {
            Ok(sweep) => sweep,
            Err(error) => {
                metrics::counter!("outbox_order_expiry_failures_total").increment(1);
                tracing::warn!(error = %error, "the expiry sweep failed; the next slot sweeps again");
                return Ok(None);
            }
        };
        if !sweep.expired.is_empty() && fallback {
            tracing::warn!(
                expired = sweep.expired.len(),
                orders = ?sweep.expired,
                "expired unpaid orders in the minutely sweep of a relay without \
                 ORDER_PAYMENT_WINDOW: set it on the relays too, so they expire on time"
            );
        } else if !sweep.expired.is_empty() {
            tracing::info!(
                expired = sweep.expired.len(),
                orders = ?sweep.expired,
                "expired unpaid orders"
            );
        }
        if !sweep.failed.is_empty() {
            let failed: Vec<String> = sweep
                .failed
                .iter()
                .map(|(order_id, error)| format!("order {order_id}: {error}"))
                .collect();
            metrics::counter!("outbox_order_expiry_failures_total")
                .increment(u64::try_from(failed.len()).unwrap_or(u64::MAX));
            tracing::warn!(
                failed = failed.len(),
                expired = sweep.expired.len(),
                orders = %failed.join("; "),
                "some due orders could not be expired; the next slot tries them again"
            );
        }
        Ok(None)
    }
}

/// What decides a relay's periodic jobs.
#[derive(Debug, Clone)]
pub struct PeriodicPlan {
    /// The kinds the relay claims.
    pub kinds: Vec<EffectKind>,
    /// `ORDER_PAYMENT_WINDOW` is set here: the expiry sweep runs every
    /// [`EXPIRY_SWEEP_EVERY`]. Without it, a relay that claims the sweep's
    /// kind still sweeps every [`EXPIRY_FALLBACK_EVERY`], for the orders an
    /// API with a window placed.
    pub payment_window: bool,
    /// How often a relay without a payment window sweeps
    /// ([`EXPIRY_FALLBACK_EVERY`] in a relay).
    pub expiry_fallback_every: Duration,
    /// `max_attempts` of the jobs the periodic jobs enqueue themselves.
    pub max_attempts: i32,
    /// `FANOUT_INLINE` of the events the periodic jobs write.
    pub fanout_inline: usize,
}

/// A sweep is never retried: the next slot sweeps again.
const SWEEP_MAX_ATTEMPTS: i32 = 1;

/// The sweep's name on relays without a payment window. A name of its own,
/// because one name has one schedule across the relays that declare it.
pub const EXPIRY_FALLBACK_NAME: &str = "order_expiry_fallback";

/// How often a relay without a payment window sweeps: an order placed by an
/// API with a window still expires, at most this late.
pub const EXPIRY_FALLBACK_EVERY: Duration = Duration::from_secs(60);

/// The relay's periodic jobs under `plan`.
pub fn periodic_jobs(plan: &PeriodicPlan) -> Result<Vec<PeriodicJob>, InvalidPeriodicJob> {
    let claims = |kind: EffectKind| plan.kinds.contains(&kind);
    let mut jobs = Vec::new();
    if claims(EffectKind::OrderExpiry) {
        let sweep = ExpireOrders {
            max_attempts: plan.max_attempts,
            fanout_inline: plan.fanout_inline,
            fallback: !plan.payment_window,
        };
        let (name, every) = if plan.payment_window {
            (EXPIRY_SWEEP_NAME, EXPIRY_SWEEP_EVERY)
        } else {
            (EXPIRY_FALLBACK_NAME, plan.expiry_fallback_every)
        };
        jobs.push(
            PeriodicJob::every(name, every, &sweep)?
                .options(&JobOptions::default().max_attempts(SWEEP_MAX_ATTEMPTS)),
        );
    }
    Ok(jobs)
}

/// Succeeds at once.
#[derive(Debug)]
pub struct NoopWorker;

impl Worker<Noop> for NoopWorker {
    async fn work(&self, _args: Noop, _ctx: JobContext) -> EffectResult {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expiry_sweep_is_declared_when_claimed_every_second_under_a_window() {
        let plan = |payment_window, kinds: &[EffectKind]| PeriodicPlan {
            kinds: kinds.to_vec(),
            payment_window,
            expiry_fallback_every: EXPIRY_FALLBACK_EVERY,
            max_attempts: 8,
            fanout_inline: crate::orders::DEFAULT_FANOUT_INLINE,
        };
        let all = &EffectKind::ALL;
        let jobs = periodic_jobs(&plan(true, all)).expect("valid");
        assert_eq!(
            jobs.iter().map(PeriodicJob::name).collect::<Vec<_>>(),
            [EXPIRY_SWEEP_NAME]
        );
        assert_eq!(jobs[0].kind(), "order_expiry");
        assert_eq!(jobs[0].schedule().to_string(), "every 1s");
        let fallback = periodic_jobs(&plan(false, all)).expect("valid");
        assert_eq!(
            fallback.iter().map(PeriodicJob::name).collect::<Vec<_>>(),
            [EXPIRY_FALLBACK_NAME]
        );
        assert_eq!(fallback[0].kind(), "order_expiry");
        assert_eq!(fallback[0].schedule().to_string(), "every 1m");
        let mailer_only = plan(true, &[EffectKind::ConfirmationEmail]);
        assert!(periodic_jobs(&mailer_only).expect("valid").is_empty());
    }
}
