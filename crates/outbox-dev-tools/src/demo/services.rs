//! How the demo starts the API and a relay in this process, and stops them.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use super::endpoints::Subscribers;
use super::sinks::smtp::SmtpSink;
use super::{DemoArgs, MAIL_FROM, SHUTDOWN_GRACE, WEBHOOK_SECRET};
use order_service::api::{self, ApiSettings};
use order_service::api_keys;
use order_service::db::{self, PgPool, PoolOptions};
use order_service::effects::email::{EmailConfig, Mailer};
use order_service::effects::webhook::{WebhookConfig, WebhookSender};
use order_service::effects::{self, EffectKind};
use order_service::server::Application;
use order_service::worker_pool::{BackoffPolicy, PoolSettings, WorkerPool};

/// The API and the relay, running in this process.
pub(super) struct Running {
    pub(super) api_url: String,
    /// The API's `/metrics`, on its own port.
    pub(super) metrics_url: Option<String>,
    /// The dashboard's operator token, with `--keep-running` (printed with its URL).
    pub(super) admin_token: Option<String>,
    /// The run's API key (`orders:*`), sent with every request; revoked when
    /// the run ends, since the database may outlive it.
    pub(super) api_key: String,
    api_key_name: String,
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
    subscribers: &Subscribers,
    services: &CancellationToken,
) -> anyhow::Result<Running> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding the API to a free port")?;
    // A run that stays up gets the dashboard, with a fresh token nobody else knows.
    let admin_token = args.keep_running.then(demo_admin_token).transpose()?;
    let admin = admin_token.as_deref().map(|token| {
        let tokens = order_service::config::dashboard::parse_admin_tokens(
            Some(&format!("op:{token}")),
            None,
        )
        .unwrap_or_default();
        let mut settings = order_service::config::dashboard::AdminSettings::new(tokens);
        settings.mail_domain = order_service::config::mail_from_domain(MAIL_FROM);
        settings
    });
    // The emails' receipt links, signed with a key of this run's own.
    let receipt_links = order_service::links::ReceiptLinks::new(
        &random_bytes::<32>("the receipt links' key")?,
        order_service::links::DEFAULT_RECEIPT_LINK_TTL,
    )
    .map_err(|e| anyhow::anyhow!("the demo's receipt link key {e}"))?;
    let api_settings = ApiSettings {
        max_attempts: args.enqueue.max_attempts,
        fanout_inline: args.enqueue.fanout_inline,
        shutdown_grace: SHUTDOWN_GRACE,
        admin,
        receipt_links: Some(receipt_links.clone()),
        ..ApiSettings::default()
    };
    // Metrics on a port of their own, as `serve` has them (METRICS_ADDR).
    let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let app = Application::build(
        api::connect(database_url, &api_settings),
        api_settings,
        listener,
    )?
    .with_metrics(metrics);
    let api_url = format!("http://{}", app.local_addr());
    let metrics_url = app
        .metrics_addr()
        .map(|addr| format!("http://{addr}/metrics"));
    let (api_key_name, api_key) = create_demo_key(database_url).await?;

    let mailer = Mailer::new(&EmailConfig {
        smtp_url: smtp.url(),
        mail_from: MAIL_FROM.to_owned(),
        // Links in the emails lead to this run's API.
        public_base_url: api_url.clone(),
        receipt_links: Some(receipt_links),
    })?;
    // Every delivery goes to an endpoint row; the relay's own WEBHOOK_URL
    // (a `default` for jobs queued before endpoints) is given one anyway.
    let sender = WebhookSender::new(&WebhookConfig {
        url: subscribers.webhooks[0].sink.url(),
        secret: WEBHOOK_SECRET.to_owned(),
        timeout: Duration::from_secs(10),
        allow_private: true,
    })?;
    let mut kinds = vec![
        EffectKind::ConfirmationEmail,
        EffectKind::OrderEmail,
        EffectKind::ReceiptPdf,
        EffectKind::OrderWebhook,
    ];
    if subscribers.stream().is_some() {
        kinds.push(EffectKind::OrderPublish);
    }
    kinds.push(EffectKind::OrderExpiry);
    let mut settings = PoolSettings::new(
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
    // The sweep that expires the demo's unpaid order, as a relay declares it
    // under ORDER_PAYMENT_WINDOW.
    settings.periodic_jobs = effects::periodic_jobs(&effects::PeriodicPlan {
        kinds: kinds.clone(),
        payment_window: true,
        expiry_fallback_every: effects::EXPIRY_FALLBACK_EVERY,
        max_attempts: args.enqueue.max_attempts,
        fanout_inline: args.enqueue.fanout_inline,
    })?;
    settings.periodic_enqueuer = order_service::orders::order_enqueuer();
    // Reading and parsing a 20 MB font must not hold up a runtime thread: the
    // signal watcher runs on them and a second Ctrl-C must get through.
    let receipt_args = args.receipt.clone();
    let receipt =
        tokio::task::spawn_blocking(move || effects::settings::receipt(&receipt_args, true))
            .await??;
    let relay_pool = db::build_pool(
        database_url,
        &PoolOptions {
            size: 12,
            ..PoolOptions::default()
        },
    );
    let executor = Arc::new(effects::workers_with_nats(
        relay_pool.clone(),
        Some(mailer),
        Some(sender),
        receipt,
        // The demo's NATS server is on loopback, like its receivers.
        effects::nats::NatsConnections::new(None, true),
        // The demo stores its secrets as a deployment without SECRETS_KEY does.
        order_service::sealed::Keyring::none(),
    ));
    let relay = WorkerPool::new(relay_pool, database_url, settings, executor)?;

    Ok(Running {
        api_url,
        metrics_url,
        admin_token,
        api_key,
        api_key_name,
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

/// A key with every scope, named after this run (the database may be a
/// shared one, from DATABASE_URL, with keys of its own).
async fn create_demo_key(database_url: &str) -> anyhow::Result<(String, String)> {
    let url = database_url.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut conn = db::establish(&url)?;
        let name = api_keys::KeyName::parse(&format!(
            "demo-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ))
        .map_err(|e| anyhow::anyhow!("the demo key's name {e}"))?;
        let created = api_keys::create_key(&mut conn, &name, &[api_keys::Scope::All], None)
            .context("creating the demo's API key")?;
        Ok((created.name, created.secret.expose().to_owned()))
    })
    .await?
}

/// 128 random bits, hex (32 characters, the shortest `ADMIN_TOKEN` accepted):
/// the demo dashboard's operator token.
fn demo_admin_token() -> anyhow::Result<String> {
    Ok(hex::encode(random_bytes::<16>("the admin token")?))
}

/// `N` bytes from the operating system's CSPRNG, for the secret named `what`.
fn random_bytes<const N: usize>(what: &str) -> anyhow::Result<[u8; N]> {
    let mut bytes = [0_u8; N];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness for {what}: {e}"))?;
    Ok(bytes)
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
        let (url, name) = (self.database_url, self.api_key_name);
        let revoked = tokio::task::spawn_blocking(move || {
            let mut conn = db::establish(&url)?;
            api_keys::revoke_key(&mut conn, &name)?;
            anyhow::Ok(())
        })
        .await;
        if let Ok(Err(error)) | Err(error) = revoked.map_err(anyhow::Error::from) {
            eprintln!("the demo's API key could not be revoked: {error:#}");
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_demo_admin_token_is_long_enough_for_the_dashboard() {
        let token = super::demo_admin_token().expect("randomness");
        assert!(
            token.len() >= order_service::config::dashboard::MIN_ADMIN_TOKEN_CHARS,
            "{token}"
        );
        let tokens = order_service::config::dashboard::parse_admin_tokens(
            Some(&format!("op:{token}")),
            None,
        );
        assert_eq!(tokens.map(|t| t.len()), Ok(1));
    }
}
