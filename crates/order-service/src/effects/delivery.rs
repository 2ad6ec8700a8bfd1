//! The workers that deliver to endpoints: an order event ([`WebhookWorker`])
//! and a notice about the endpoints themselves ([`EndpointNoticeWorker`]).
//! Each reads its endpoint fresh (URL, secrets, enabled), signs with that
//! endpoint's secrets, logs the attempt in `delivery_attempts`, and hands
//! the endpoint's health to its breaker.

use std::time::Duration;

use outbox_core::worker::{EffectError, EffectResult, JobContext, Worker};
use tracing::Instrument as _;

use super::jobs::EndpointNotice;
use super::ledger::{EffectAnswer, record_effect};
use super::order_loader::{OrderLoader, order_span};
use super::webhook::{AttemptOutcome, Secrets, WebhookSender, idempotency_key};
use crate::db::{PgPool, run_blocking};
use crate::endpoints::attempts::{self, NewAttempt};
use crate::endpoints::breaker::Verdict;
use crate::endpoints::target::{self, DEFAULT_ENDPOINT, Target};
use crate::orders::jobs::OrderWebhook;
use crate::orders::{EndpointId, EventId};
use crate::sealed::Keyring;

/// How long a delivery claimed for a disabled endpoint waits before it is
/// tried again (the endpoint's paused key normally keeps it unclaimed).
const DISABLED_RETRY: Duration = Duration::from_secs(60);

/// How long a delivery for a missing `default` waits before it is tried again.
const NO_DEFAULT_RETRY: Duration = Duration::from_secs(60);

/// How long a delivery whose endpoint's secret is sealed under a key this
/// relay lacks waits before it is tried again (by a relay that may have it).
const NO_KEY_RETRY: Duration = Duration::from_secs(60);

/// Delivers an order event to its endpoint.
#[derive(Debug)]
pub struct WebhookWorker {
    pub(super) orders: OrderLoader,
    pub(super) sender: Option<WebhookSender>,
    /// Opens the endpoints' sealed secrets.
    pub(super) secrets: Keyring,
}

impl Worker<OrderWebhook> for WebhookWorker {
    async fn work(&self, args: OrderWebhook, ctx: JobContext) -> EffectResult {
        let span = order_span(args.order_id);
        self.deliver(args, ctx).instrument(span).await
    }
}

impl WebhookWorker {
    async fn deliver(&self, args: OrderWebhook, ctx: JobContext) -> EffectResult {
        let sender = sender_of(self.sender.as_ref())?;
        let order = self.orders.order(args.order_id).await?;
        let event = self.orders.event(EventId::new(args.event_id)).await?;
        let endpoint_id = args.endpoint_id.map(EndpointId::new);
        let Some(target) = load_target(&self.orders.pool, endpoint_id).await? else {
            return match args.endpoint_id {
                // A sender built with its own URL (a library user's, the
                // demo's) is what `default` would be. A relay writes
                // `default` from WEBHOOK_URL before it claims, so it never
                // needs this.
                None if sender.has_fallback() => {
                    sender.deliver(ctx.id(), &order, &event).await?;
                    Ok(None)
                }
                None => Err(no_default()),
                Some(id) => Err(EffectError::permanent(format!(
                    "endpoint {id} no longer exists (removed)"
                ))),
            };
        };
        let (url, secrets) = usable(&target, &self.secrets)?;
        let started_at = chrono::Utc::now();
        let outcome = sender
            .deliver_to(&url, &secrets, ctx.id(), &order, &event)
            .await;
        after_attempt(
            &self.orders.pool,
            sender,
            &target,
            &ctx,
            started_at,
            outcome,
        )
        .await
    }
}

/// Delivers an `endpoint.disabled` notice to one subscribed endpoint.
#[derive(Debug)]
pub struct EndpointNoticeWorker {
    pub(super) pool: PgPool,
    pub(super) sender: Option<WebhookSender>,
    pub(super) secrets: Keyring,
}

impl Worker<EndpointNotice> for EndpointNoticeWorker {
    async fn work(&self, args: EndpointNotice, ctx: JobContext) -> EffectResult {
        let sender = sender_of(self.sender.as_ref())?;
        let target = load_target(&self.pool, Some(args.endpoint_id))
            .await?
            .ok_or_else(|| {
                EffectError::permanent(format!(
                    "endpoint {} no longer exists (removed)",
                    args.endpoint_id
                ))
            })?;
        let (url, secrets) = usable(&target, &self.secrets)?;
        let body = serde_json::to_vec(&args.event)
            .map_err(|e| EffectError::permanent(format!("the notice does not serialize: {e}")))?;
        let started_at = chrono::Utc::now();
        let outcome = sender.post_to(&url, &secrets, ctx.id(), body).await;
        after_attempt(&self.pool, sender, &target, &ctx, started_at, outcome).await
    }
}

fn sender_of(sender: Option<&WebhookSender>) -> Result<&WebhookSender, EffectError> {
    sender.ok_or_else(|| {
        EffectError::retryable("this relay was started without a webhook sender (see --kinds)")
    })
}

/// A delivery queued before endpoints existed (no endpoint in its payload)
/// goes to `default`, and there is none. Retryable, not permanent: `default`
/// is often only late (the relay or `migrate` that carries WEBHOOK_URL writes
/// it when it starts, and relays roll out in any order), and a retry then
/// delivers without an operator. If it never comes, the job fails after its
/// max_attempts with this message, and `endpoints recover default` puts it
/// back once `default` exists.
fn no_default() -> EffectError {
    EffectError::Retryable {
        message: format!(
            "this delivery was queued before endpoints existed and goes to the endpoint \
             {DEFAULT_ENDPOINT:?}, which does not exist: set WEBHOOK_URL and WEBHOOK_SECRET \
             on a relay, `serve` or `migrate` (they write it), or \
             `outbox-relay endpoints add --name {DEFAULT_ENDPOINT} ...`"
        ),
        retry_after: Some(NO_DEFAULT_RETRY),
    }
}

async fn load_target(
    pool: &PgPool,
    endpoint_id: Option<EndpointId>,
) -> Result<Option<Target>, EffectError> {
    run_blocking(pool, move |conn| Ok(target::load(conn, endpoint_id)?))
        .await
        .map_err(|e| EffectError::retryable(format!("loading the endpoint: {e}")))
}

/// The endpoint's URL and secrets, if it takes deliveries now. A secret that
/// cannot be opened fails the delivery before any call: retried when the
/// relay lacks the key (its configuration, not the job, is wrong),
/// permanent when no key opens it (altered, or moved from another row).
fn usable(target: &Target, keys: &Keyring) -> Result<(url::Url, Secrets), EffectError> {
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
    let signing = target.signing_secrets(keys).map_err(|e| {
        if e.is_missing_key() {
            EffectError::Retryable {
                message: e.to_string(),
                retry_after: Some(NO_KEY_RETRY),
            }
        } else {
            EffectError::permanent(e.to_string())
        }
    })?;
    let secrets = Secrets::parse(&signing).map_err(|e| {
        EffectError::permanent(format!("endpoint {:?} has a bad secret: {e}", target.name))
    })?;
    Ok((url, secrets))
}

/// Logs the attempt, moves the endpoint's breaker, and returns the attempt's
/// result: on success, the receiver's answer for the effect ledger. Neither the log nor the breaker can undo a call that happened:
/// their failures are logged, never the job's.
async fn after_attempt(
    pool: &PgPool,
    sender: &WebhookSender,
    target: &Target,
    ctx: &JobContext,
    started_at: chrono::DateTime<chrono::Utc>,
    outcome: AttemptOutcome,
) -> EffectResult {
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
        stream_sequence: None,
    };
    let breaker = sender.breaker();
    let endpoint_id = target.id;
    let verdict = run_blocking(pool, move |conn| {
        let Some(health) = attempts::record(conn, &attempt)? else {
            return Ok(Ok(None));
        };
        Ok(breaker
            .after_attempt(conn, endpoint_id, &health, chrono::Utc::now())
            .map(Some))
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|breaker| breaker.map_err(|e| e.to_string()));
    let answer = match (&outcome.result, outcome.status, outcome.answer_sha256) {
        (Ok(()), Some(status_code), Some(answer_sha256)) => Some(EffectAnswer::Webhook {
            endpoint: target.name.clone(),
            webhook_id: idempotency_key(ctx.id()),
            status_code,
            answer_sha256,
        }),
        _ => None,
    };
    let mut result = outcome.result;
    match verdict {
        Ok(Some(Verdict::Probing(probe_at))) => {
            // The endpoint's key lets nothing through before the probe: the
            // retry says so, in its run_after and in the relay's retry_in.
            held_until_probe(&mut result, &target.name, probe_at);
        }
        Ok(Some(Verdict::Disabled { endpoint, told })) => {
            tracing::warn!(
                endpoint = %endpoint,
                disable_after = %humantime::format_duration(breaker.disable_after),
                told,
                "endpoint disabled: every delivery failed for ENDPOINT_DISABLE_AFTER; \
                 its deliveries wait until `outbox-relay endpoints enable {endpoint}`"
            );
            metrics::counter!("outbox_endpoints_disabled_total", "endpoint" => endpoint)
                .increment(1);
        }
        Ok(Some(Verdict::Healthy { recovered: true })) => {
            tracing::info!(endpoint = %target.name, "endpoint recovered: a delivery succeeded");
        }
        Ok(_) => {}
        Err(error) => {
            tracing::warn!(endpoint = %target.name, %error, "cannot log the delivery attempt");
        }
    }
    result?;
    Ok(answer.map(|answer| record_effect(ctx.id(), answer)))
}

/// Makes a retryable failure wait for the tripped endpoint's next probe at
/// `probe_at`, when its own backoff would be shorter.
fn held_until_probe(
    result: &mut Result<(), EffectError>,
    endpoint: &str,
    probe_at: chrono::DateTime<chrono::Utc>,
) {
    if let Err(EffectError::Retryable {
        message,
        retry_after,
    }) = result
    {
        let wait = (probe_at - chrono::Utc::now()).to_std().unwrap_or_default();
        *retry_after = Some(retry_after.unwrap_or_default().max(wait));
        message.push_str(&format!(
            " (endpoint {endpoint:?} has failed every call for ENDPOINT_TRIP_AFTER: \
             it is probed one delivery at a time, next at {})",
            probe_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        ));
    }
}
