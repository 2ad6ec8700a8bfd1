//! `outbox-relay serve`: the order HTTP API.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use crate::api::api_key_limit::{DEFAULT_RATE_LIMIT, RateLimitSetting, parse_rate_limit};
use crate::api::{self, ApiAuth, ApiSettings, DEFAULT_ADDRESS_LIMIT};
use crate::config::{
    AdminArgs, ConfigError, DEFAULT_API_ADDR, DEFAULT_API_METRICS_ADDR, DatabaseArgs,
    DefaultEndpointArgs, EnqueueArgs, HttpLimitsArgs, LinkArgs, PaymentWindowArgs, SecretsKeyArgs,
    parse_positive_duration, parse_socket_addr,
};
use crate::db;
use crate::server::Application;
use order_service::http_server::ConnectionLimits;

/// Everything `serve` reads besides the database.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address the API listens on.
    #[arg(long = "api-addr", env = "API_ADDR", default_value = DEFAULT_API_ADDR, value_parser = parse_socket_addr)]
    pub addr: SocketAddr,
    /// Address of the API's /metrics (and /healthz, /readyz, /livez), apart
    /// from the public port: metrics tell the business's volume.
    #[arg(long, env = "METRICS_ADDR", default_value = DEFAULT_API_METRICS_ADDR, value_parser = parse_socket_addr)]
    pub metrics_addr: SocketAddr,
    /// Longest a request may take, reading its body included; past it, 503.
    #[arg(long, env = "API_REQUEST_TIMEOUT", default_value = "10s", value_parser = parse_positive_duration)]
    pub request_timeout: Duration,
    #[command(flatten)]
    pub http: HttpLimitsArgs,
    #[command(flatten)]
    pub enqueue: EnqueueArgs,
    #[command(flatten)]
    pub payment_window: PaymentWindowArgs,
    #[command(flatten)]
    pub admin: AdminArgs,
    #[command(flatten)]
    pub links: LinkArgs,
    /// `keys`: every /orders route needs `Authorization: Bearer <key>` with
    /// its scope (create keys with `outbox-relay keys create`). `none`: no
    /// checks, for local development only.
    #[arg(long, env = "API_AUTH", value_enum, default_value_t = ApiAuth::Keys)]
    pub api_auth: ApiAuth,
    /// Requests per API key, counted by each replica: 50/s, 600/m, 10000/h,
    /// or none. A key may send a burst of that many at once; past it, 429
    /// with Retry-After.
    #[arg(long, env = "API_RATE_LIMIT", default_value = DEFAULT_RATE_LIMIT, value_parser = parse_rate_limit)]
    pub api_rate_limit: RateLimitSetting,
    /// Failed or unauthenticated requests per client address (the client as
    /// TRUSTED_PROXIES forward it; loopback never counts), checked before
    /// authentication: 60/m, 1000/h, or none. Past it, 429 with Retry-After,
    /// until the budget refills. Requests with a valid key never count.
    #[arg(long, env = "API_ADDRESS_LIMIT", default_value = DEFAULT_ADDRESS_LIMIT, value_parser = parse_rate_limit)]
    pub api_address_limit: RateLimitSetting,
    #[command(flatten)]
    pub default_endpoint: DefaultEndpointArgs,
    #[command(flatten)]
    pub secrets: SecretsKeyArgs,
    /// How long the ids of messages received on /inbound are kept: a copy
    /// that arrives later is applied again. Longer than the providers retry
    /// (Stripe: 3 days, and 30 for a resend by hand). A held message is kept
    /// until an operator decides it, whatever its age.
    #[arg(long, env = "INBOX_RETENTION", default_value = "35d", value_parser = parse_positive_duration)]
    pub inbox_retention: Duration,
}

pub async fn run(db_args: DatabaseArgs, args: ServeArgs) -> anyhow::Result<()> {
    let default_endpoint = super::default_endpoint::checked(&args.default_endpoint)?;
    let keys = args.secrets.keyring()?;
    crate::at_rest::warn_without_key(&keys);
    // A port already taken is a deployment mistake: say so before migrating.
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .map_err(|e| ConfigError(format!("API_ADDR {}: cannot listen: {e}", args.addr)))?;

    // With API_AUTH=none (keys off, receipts open) the key is optional.
    let receipt_links = args
        .links
        .receipt_links(args.api_auth == ApiAuth::Keys, "serve")?;
    // Checked before the database is touched, like every other setting.
    let admin = args.admin.settings()?;
    let metrics = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .map_err(|e| {
            ConfigError(format!(
                "METRICS_ADDR {}: cannot listen: {e}",
                args.metrics_addr
            ))
        })?;

    let shutdown = crate::shutdown::on_signals();
    let migrated = db::migrate_when_writable(&db_args.database_url, &shutdown)
        .await
        .context("migrating the database")?;
    if !migrated {
        return Ok(());
    }
    super::default_endpoint::write(&db_args.database_url, default_endpoint, &keys).await?;
    super::secrets::check_stored_at_start(&db_args.database_url, &keys).await?;

    let trusted_proxies = args.admin.trusted_proxies.clone().unwrap_or_default();
    let settings = ApiSettings {
        max_attempts: args.enqueue.max_attempts,
        fanout_inline: args.enqueue.fanout_inline,
        payment_window: args.payment_window.payment_window.get(),
        request_timeout: args.request_timeout,
        connections: ConnectionLimits {
            trusted_proxies: trusted_proxies.clone(),
            ..ConnectionLimits::from(&args.http)
        },
        admin: admin.clone(),
        receipt_links,
        secrets: keys,
        auth: args.api_auth,
        rate_limit: args.api_rate_limit.0,
        address_limit: args.api_address_limit.0,
        trusted_proxies,
        ..ApiSettings::default()
    };
    let database = api::connect(&db_args.database_url, &settings);
    let app = Application::build(database, settings, listener)?.with_metrics(metrics);
    // On stdout, for people and scripts that asked for port 0.
    println!("serving the order API on http://{}", app.local_addr());
    if args.api_auth == ApiAuth::None {
        println!("WARNING: API_AUTH=none: the order API asks no one for a key");
    }
    if admin.is_some() {
        println!("dashboard on http://{}/admin", app.local_addr());
    }
    let pruner = tokio::spawn(prune_inbox(
        db_args.database_url.clone(),
        args.inbox_retention,
        shutdown.clone(),
    ));
    app.run_until_stopped(shutdown.clone()).await?;
    shutdown.cancel();
    let _ = pruner.await;
    Ok(())
}

/// How often the API prunes its inbox; a message is kept at most this much
/// past `INBOX_RETENTION`.
const INBOX_PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// Deletes inbox messages older than `retention` (never a held one), soon
/// after the start and then hourly, until `shutdown`. Every replica does it; the deletes are
/// small batches, so two at once only find less to do.
async fn prune_inbox(
    database_url: String,
    retention: Duration,
    shutdown: crate::shutdown::CancellationToken,
) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(60)) => {}
            () = shutdown.cancelled() => return,
        }
        let url = database_url.clone();
        let pruned = tokio::task::spawn_blocking(move || {
            let mut conn = db::establish(&url)?;
            anyhow::Ok(crate::inbox::retention::prune_messages(
                &mut conn,
                retention,
                crate::inbox::retention::PRUNE_BATCH,
            )?)
        })
        .await;
        match pruned {
            Ok(Ok(pruned)) if pruned.messages == 0 => {}
            Ok(Ok(pruned)) => tracing::info!(
                pruned = pruned.messages,
                unmatched_payments = pruned.unmatched_payments,
                ?retention,
                "pruned old inbox messages (held ones are kept until decided)"
            ),
            Ok(Err(error)) => {
                tracing::warn!(
                    error = format!("{error:#}"),
                    "pruning the inbox failed; retrying later"
                );
            }
            Err(error) => tracing::warn!(%error, "the inbox prune task failed"),
        }
        tokio::select! {
            () = tokio::time::sleep(INBOX_PRUNE_EVERY.saturating_sub(Duration::from_secs(60))) => {}
            () = shutdown.cancelled() => return,
        }
    }
}
