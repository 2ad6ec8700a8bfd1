//! `outbox-relay relay`: the sidecar worker pool.

use std::sync::Arc;

use anyhow::Context as _;

use crate::config::{ConfigError, DatabaseArgs, RelayArgs};
use crate::db;
use crate::effects::{self, EffectKind, email, webhook};
use crate::relay::Relay;

pub async fn run(db_args: DatabaseArgs, args: RelayArgs) -> anyhow::Result<()> {
    // Validate everything before touching the network: a misconfigured sidecar
    // should fail at deploy time, naming what is wrong.
    let settings = args.settings()?;
    let kinds = args.kinds();
    let email = args
        .effects
        .email(kinds.contains(&EffectKind::ConfirmationEmail))?;
    let webhook = args
        .effects
        .webhook(kinds.contains(&EffectKind::OrderWebhook))?;
    let receipt = args
        .receipt
        .settings(kinds.contains(&EffectKind::ReceiptPdf))?;
    let mailer = email
        .as_ref()
        .map(email::Mailer::new)
        .transpose()
        // Mailer::new names the variable at fault (SMTP_URL, MAIL_FROM, PUBLIC_BASE_URL).
        .map_err(|e| ConfigError(format!("{e:#}")))?;
    let sender = webhook
        .as_ref()
        .map(webhook::WebhookSender::new)
        .transpose()
        .map_err(|e| ConfigError(format!("WEBHOOK_URL: {e:#}")))?;
    let nats = args.effects.nats().await?;
    let metrics = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .map_err(|e| {
            ConfigError(format!(
                "METRICS_ADDR {}: cannot listen: {e}",
                args.metrics_addr
            ))
        })?;
    let metrics_local_addr = metrics.local_addr().ok();

    let url = db_args.database_url.clone();
    tokio::task::spawn_blocking(move || db::migrate_url(&url))
        .await?
        .context("migrating the database")?;

    // By default one connection per effect slot (effects load their order),
    // plus the producer, the completer, the heartbeat and the reaper.
    let pool_size = args.pool_size.map_or_else(
        || u32::try_from(settings.concurrency.min(64) + 4).unwrap_or(68),
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
    let executor = Arc::new(effects::workers_with_nats(
        pool.clone(),
        mailer,
        sender,
        receipt,
        nats.clone(),
    ));

    // The relay's gauges bind to the recorder installed when they are made,
    // and its listener makes one as soon as it starts: install ours first.
    let _ = crate::telemetry::metrics_handle();
    let shutdown = crate::shutdown::on_signals();
    let relay = Relay::new(pool.clone(), db_args.database_url, settings, executor)?;
    let metrics_server = tokio::spawn(crate::telemetry::serve_metrics(
        metrics,
        pool,
        args.http.limits(),
        Some(relay.liveness()),
        Some(nats),
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

    relay.run_until_stopped(shutdown.clone()).await;
    shutdown.cancel();
    let _ = metrics_server.await;
    Ok(())
}
