//! How the demo starts the API and a relay in this process, and stops them.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use super::sinks::smtp::SmtpSink;
use super::sinks::webhook::WebhookSink;
use super::{DemoArgs, MAIL_FROM, SHUTDOWN_GRACE, WEBHOOK_SECRET};
use crate::api::{self, ApiSettings, Application};
use crate::db::{self, PgPool, PoolOptions};
use crate::effects::email::{EmailConfig, Mailer};
use crate::effects::webhook::{WebhookConfig, WebhookSender};
use crate::effects::{self, EffectKind};
use crate::relay::{BackoffPolicy, Relay, RelaySettings};

/// The API and the relay, running in this process.
pub(super) struct Running {
    pub(super) api_url: String,
    /// The dashboard's operator token, with `--keep-running` (printed with its URL).
    pub(super) admin_token: Option<String>,
    pub(super) database_url: String,
    /// A small pool for the demo's own reads of the jobs table.
    pub(super) watch_pool: PgPool,
    api: tokio::task::JoinHandle<std::io::Result<()>>,
    relay: tokio::task::JoinHandle<()>,
}

pub(super) async fn start_services(
    args: &DemoArgs,
    database_url: &str,
    smtp: &SmtpSink,
    webhook: &WebhookSink,
    services: &CancellationToken,
) -> anyhow::Result<Running> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding the API to a free port")?;
    // A run that stays up gets the dashboard, with a fresh token nobody else knows.
    let admin_token = args.keep_running.then(demo_admin_token).transpose()?;
    let admin = admin_token.as_deref().map(|token| {
        let tokens =
            api::admin::parse_admin_tokens(Some(&format!("op:{token}")), None).unwrap_or_default();
        let mut settings = api::admin::AdminSettings::new(tokens);
        settings.mail_domain = crate::effects::email::mail_from_domain(MAIL_FROM);
        settings
    });
    let api_settings = ApiSettings {
        max_attempts: args.enqueue.max_attempts,
        shutdown_grace: SHUTDOWN_GRACE,
        admin,
        ..ApiSettings::default()
    };
    let app = Application::build(
        api::connect(database_url, &api_settings),
        api_settings,
        listener,
    )?;
    let api_url = format!("http://{}", app.local_addr());

    let mailer = Mailer::new(&EmailConfig {
        smtp_url: smtp.url(),
        mail_from: MAIL_FROM.to_owned(),
        // Links in the emails lead to this run's API.
        public_base_url: api_url.clone(),
    })?;
    let sender = WebhookSender::new(&WebhookConfig {
        url: webhook.url(),
        secret: WEBHOOK_SECRET.to_owned(),
        timeout: Duration::from_secs(10),
        allow_private: true,
    })?;
    let kinds = [
        EffectKind::ConfirmationEmail,
        EffectKind::ReceiptPdf,
        EffectKind::OrderWebhook,
    ];
    let mut settings = RelaySettings::new(
        format!("demo-{}", std::process::id()),
        kinds.iter().map(|k| k.as_str().to_owned()).collect(),
    )
    .with_lease(Duration::from_secs(30));
    // Two cores are plenty for a handful of orders; leave room for the build.
    settings.concurrency = 8;
    settings.batch_size = 8;
    // Retries become due between NOTIFYs; a short poll picks them up on time.
    settings.poll_interval = Duration::from_millis(100);
    settings.shutdown_grace = SHUTDOWN_GRACE;
    settings.backoff = BackoffPolicy {
        base: args.backoff_base,
        max: args.backoff_base.max(Duration::from_secs(5)),
    };
    // Reading and parsing a 20 MB font must not hold up a runtime thread: the
    // signal watcher runs on them and a second Ctrl-C must get through.
    let receipt_args = args.receipt.clone();
    let receipt = tokio::task::spawn_blocking(move || receipt_args.settings(true)).await??;
    let relay_pool = db::build_pool(
        database_url,
        &PoolOptions {
            size: 12,
            ..PoolOptions::default()
        },
    );
    let executor = Arc::new(effects::workers(
        relay_pool.clone(),
        Some(mailer),
        Some(sender),
        receipt,
    ));
    let relay = Relay::new(relay_pool, database_url, settings, executor)?;

    Ok(Running {
        api_url,
        admin_token,
        database_url: database_url.to_owned(),
        watch_pool: db::build_pool(
            database_url,
            &PoolOptions {
                size: 2,
                ..PoolOptions::default()
            },
        ),
        api: tokio::spawn(app.run_until_stopped(services.clone())),
        relay: tokio::spawn(relay.run_until_stopped(services.clone())),
    })
}

/// 128 random bits, hex: the demo dashboard's operator token.
fn demo_admin_token() -> anyhow::Result<String> {
    let mut bytes = [0_u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| anyhow::anyhow!("no randomness for the admin token: {e}"))?;
    Ok(hex::encode(bytes))
}

impl Running {
    pub(super) async fn stop(self, services: &CancellationToken) {
        services.cancel();
        let limit = SHUTDOWN_GRACE * 2;
        match tokio::time::timeout(limit, self.relay).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => eprintln!("the relay task failed: {error}"),
            Err(_) => eprintln!("the relay did not stop within {limit:?}"),
        }
        match tokio::time::timeout(limit, self.api).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => eprintln!("the API stopped with an error: {error}"),
            Ok(Err(error)) => eprintln!("the API task failed: {error}"),
            Err(_) => eprintln!("the API did not stop within {limit:?}"),
        }
    }
}
