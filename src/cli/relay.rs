//! `outbox-relay relay`: the sidecar worker pool.

use std::sync::Arc;

use anyhow::Context as _;

use crate::config::{ConfigError, DatabaseArgs, RelayArgs};
use crate::db;
use crate::effects::{EffectKind, Effects, email, receipt, webhook};
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
    let pool = db::build_pool(&db_args.database_url, pool_size, false);
    let executor = Arc::new(Effects::new(
        pool.clone(),
        mailer,
        sender,
        receipt::ReceiptSettings::default(),
    ));

    let shutdown = crate::shutdown::on_signals();
    let metrics_server = tokio::spawn(crate::telemetry::serve_metrics(
        metrics,
        pool.clone(),
        args.http.limits(),
        shutdown.clone(),
    ));
    // The bound address, so that METRICS_ADDR=...:0 logs the port it got.
    let metrics_addr = metrics_local_addr.unwrap_or(args.metrics_addr);
    tracing::info!(addr = %metrics_addr, pool_size, "serving /metrics and /healthz");

    let relay = Relay::new(pool, db_args.database_url, settings, executor)?;
    relay.run_until_stopped(shutdown.clone()).await?;
    shutdown.cancel();
    let _ = metrics_server.await;
    Ok(())
}
