//! `outbox-relay relay`: the sidecar worker pool.

use std::sync::Arc;

use anyhow::Context as _;

use crate::config::{ConfigError, DatabaseArgs, RelayArgs, SecretsKeyArgs};
use crate::db;
use crate::effects::{self, EffectKind, email, webhook};
use crate::endpoints::breaker::Breaker;
use crate::endpoints::upkeep::Retention;
use crate::inbox::reconcile::Reconciler;
use crate::inbox::reconcile::job::{self as reconcile_job, InboxReconcile, ReconcileWorker};
use crate::inbox::reconcile::stripe_events::{RetryPolicy, StripeEvents};
use crate::outbox::PeriodicJob;
use crate::worker_pool::WorkerPool;
use order_service::http_server::ConnectionLimits;

pub async fn run(
    db_args: DatabaseArgs,
    args: RelayArgs,
    secrets: SecretsKeyArgs,
) -> anyhow::Result<()> {
    // Validate everything before touching the network: a misconfigured sidecar
    // should fail at deploy time, naming what is wrong.
    let mut settings = args.settings()?;
    settings.periodic_jobs.extend(reconcile_job(&args)?);
    let keys = secrets.keyring()?;
    crate::at_rest::warn_without_key(&keys);
    let kinds = args.kinds();
    let sends_email = kinds.iter().any(|k| k.sends_email());
    let email = effects::settings::email(&args.effects, sends_email)?;
    // Every email links to its receipt. API_AUTH=none (keys off,
    // the receipt route open) is the one case that may pass `false` here.
    let receipt_links = args
        .links
        .receipt_links(sends_email, "a relay that sends emails")?;
    let email = email.map(|config| email::EmailConfig {
        receipt_links,
        ..config
    });
    // Deliveries go to the endpoint rows; WEBHOOK_URL, when given, is only
    // the row `default`, written below before the relay claims anything.
    let webhook = effects::settings::webhook(
        &args.effects,
        kinds.contains(&EffectKind::OrderWebhook) || kinds.contains(&EffectKind::EndpointNotice),
    )?;
    let default_endpoint = super::default_endpoint::checked(&args.effects.default_endpoint)?;
    let receipt =
        effects::settings::receipt(&args.receipt, kinds.contains(&EffectKind::ReceiptPdf))?;
    let mailer = email
        .as_ref()
        .map(email::Mailer::new)
        .transpose()
        // Mailer::new names the variable at fault (SMTP_URL, MAIL_FROM, PUBLIC_BASE_URL).
        .map_err(|e| ConfigError(format!("{e:#}")))?;
    let breaker = Breaker {
        disable_after: args.effects.endpoint_disable_after,
        trip_after: args.effects.endpoint_trip_after,
        probe_max: args.effects.endpoint_probe_max,
    };
    let sender = webhook
        .as_ref()
        .map(|options| {
            webhook::WebhookSender::for_endpoints(options).map(|s| s.with_breaker(breaker))
        })
        .transpose()
        .map_err(|e| ConfigError(format!("the webhook client: {e:#}")))?;
    let nats = effects::settings::nats(&args.effects).await?;
    let metrics = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .map_err(|e| {
            ConfigError(format!(
                "METRICS_ADDR {}: cannot listen: {e}",
                args.metrics_addr
            ))
        })?;
    let metrics_local_addr = metrics.local_addr().ok();

    // The pool serves the effects' own short reads and writes (an order
    // loaded, an attempt logged), none held across a call to the outside, and
    // the outcomes with a local write; the claims, outcomes, heartbeats and
    // reaps run on the relay's own connections. So it need not grow with the
    // slots: one per slot up to 16, plus 4 for the rest.
    let pool_size = args.pool_size.map_or_else(
        || u32::try_from(settings.concurrency.min(16) + 4).unwrap_or(20),
        |size| u32::try_from(size).unwrap_or(u32::MAX),
    );
    let timeouts = args.session_timeouts()?;
    let pool = db::build_pool(
        &db_args.database_url,
        &db::PoolOptions {
            size: pool_size,
            statement_timeout: Some(timeouts.statement),
            lock_timeout: Some(timeouts.lock),
            idle_in_transaction_timeout: Some(timeouts.idle_in_transaction),
            ..db::PoolOptions::default()
        },
    );
    let reconcile_worker = reconcile_worker(&args, pool.clone(), &keys)?;
    let executor = Arc::new(
        effects::workers_with_nats(
            pool.clone(),
            mailer,
            sender,
            receipt,
            nats.clone(),
            keys.clone(),
        )
        .register::<InboxReconcile, _>(reconcile_worker),
    );

    // The relay's gauges bind to the recorder installed when they are made,
    // and its listener makes one as soon as it starts: install ours first.
    let _ = crate::telemetry::metrics_handle();
    let shutdown = crate::shutdown::on_signals();
    // Served while the start waits for a primary, so that /readyz says 503
    // then; /livez speaks for the relay once it runs.
    let liveness = Arc::new(std::sync::OnceLock::new());
    let metrics_server = tokio::spawn(crate::telemetry::serve_metrics(
        metrics,
        pool.clone(),
        ConnectionLimits::from(&args.http),
        Arc::clone(&liveness),
        Some(nats.clone()),
        crate::telemetry::QUEUE_DEPTH_TTL,
        shutdown.clone(),
    ));
    // The bound address, so that METRICS_ADDR=...:0 logs the port it got.
    let metrics_addr = metrics_local_addr.unwrap_or(args.metrics_addr);
    tracing::info!(
        addr = %metrics_addr,
        pool_size,
        statement_timeout = ?timeouts.statement,
        lock_timeout = ?timeouts.lock,
        idle_in_transaction_timeout = ?timeouts.idle_in_transaction,
        "serving /metrics, /healthz, /readyz and /livez"
    );

    let migrated = db::migrate_when_writable(&db_args.database_url, &shutdown)
        .await
        .context("migrating the database")?;
    if migrated {
        super::default_endpoint::write(&db_args.database_url, default_endpoint, &keys).await?;
        super::secrets::check_stored_at_start(&db_args.database_url, &keys).await?;
        let upkeep = tokio::spawn(crate::endpoints::upkeep::run(
            pool.clone(),
            Retention {
                attempts: args.effects.delivery_attempts_retention,
                audit: args.effects.admin_audit_retention,
            },
            crate::endpoints::upkeep::UPKEEP_EVERY,
            shutdown.clone(),
        ));
        let declared = periodic_jobs(&args, &kinds)?;
        settings.periodic_jobs.extend(declared);
        settings.periodic_enqueuer = crate::orders::order_enqueuer();
        let relay = WorkerPool::new(pool, db_args.database_url, settings, executor)?;
        let _ = liveness.set(relay.liveness());
        relay.run_until_stopped(shutdown.clone()).await;
        shutdown.cancel();
        let _ = upkeep.await;
    }
    shutdown.cancel();
    let _ = metrics_server.await;
    Ok(())
}

/// The relay's periodic jobs ([`effects::periodic_jobs`]). The expiry sweep
/// runs every second while `ORDER_PAYMENT_WINDOW` is set, and every minute
/// without it: an order placed by an API with a window is never left placed
/// long past it, whichever relays are running.
fn periodic_jobs(
    args: &RelayArgs,
    kinds: &[EffectKind],
) -> anyhow::Result<Vec<crate::outbox::PeriodicJob>> {
    let plan = effects::PeriodicPlan {
        kinds: kinds.to_vec(),
        payment_window: args.payment_window.payment_window.get().is_some(),
        expiry_fallback_every: effects::EXPIRY_FALLBACK_EVERY,
        max_attempts: args.enqueue.max_attempts,
        fanout_inline: args.enqueue.fanout_inline,
    };
    Ok(effects::periodic_jobs(&plan)?)
}

/// The periodic reconciliation (`INBOX_RECONCILE_EVERY`), when this relay
/// claims its kind and it is not `off`.
fn reconcile_job(args: &RelayArgs) -> Result<Option<PeriodicJob>, ConfigError> {
    let Some(every) = args.reconcile.inbox_reconcile_every.0 else {
        return Ok(None);
    };
    if !args.kinds().contains(&EffectKind::InboxReconcile) {
        return Ok(None);
    }
    reconcile_job::periodic_job(every)
        .map(Some)
        .map_err(|e| ConfigError(format!("INBOX_RECONCILE_EVERY: {e}")))
}

/// The worker of that job: Stripe's log at `STRIPE_API_BASE`, the sources'
/// keys opened with `SECRETS_KEY`.
fn reconcile_worker(
    args: &RelayArgs,
    pool: db::PgPool,
    keys: &crate::sealed::Keyring,
) -> Result<ReconcileWorker, ConfigError> {
    let events = StripeEvents::new(
        &args.reconcile.stripe.stripe_api_base,
        RetryPolicy::default(),
    )
    .map_err(|e| ConfigError(format!("STRIPE_API_BASE: {e:#}")))?;
    Ok(ReconcileWorker {
        reconciler: Reconciler {
            pool,
            events,
            keys: keys.clone(),
            enqueuer: crate::orders::order_enqueuer(),
            max_attempts: args.enqueue.max_attempts,
        },
    })
}
