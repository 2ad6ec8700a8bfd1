//! `outbox-relay serve`: the order HTTP API.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use crate::api::key_limit::{DEFAULT_RATE_LIMIT, RateLimitSetting, parse_rate_limit};
use crate::api::{self, ApiAuth, ApiSettings};
use crate::config::{
    AdminArgs, ConfigError, DEFAULT_API_ADDR, DatabaseArgs, DefaultEndpointArgs, EnqueueArgs,
    HttpLimitsArgs, LinkArgs, parse_positive_duration, parse_socket_addr,
};
use crate::db;
use crate::server::Application;

/// Everything `serve` reads besides the database.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address the API listens on.
    #[arg(long = "api-addr", env = "API_ADDR", default_value = DEFAULT_API_ADDR, value_parser = parse_socket_addr)]
    pub addr: SocketAddr,
    /// Longest a request may take, reading its body included; past it, 503.
    #[arg(long, env = "API_REQUEST_TIMEOUT", default_value = "10s", value_parser = parse_positive_duration)]
    pub request_timeout: Duration,
    #[command(flatten)]
    pub http: HttpLimitsArgs,
    #[command(flatten)]
    pub enqueue: EnqueueArgs,
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
    #[command(flatten)]
    pub default_endpoint: DefaultEndpointArgs,
}

pub async fn run(db_args: DatabaseArgs, args: ServeArgs) -> anyhow::Result<()> {
    let default_endpoint = args.default_endpoint.checked()?;
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

    let shutdown = crate::shutdown::on_signals();
    let migrated = db::migrate_when_writable(&db_args.database_url, &shutdown)
        .await
        .context("migrating the database")?;
    if !migrated {
        return Ok(());
    }
    crate::config::default_endpoint::write_default(&db_args.database_url, default_endpoint).await?;

    let settings = ApiSettings {
        max_attempts: args.enqueue.max_attempts,
        request_timeout: args.request_timeout,
        connections: args.http.limits(),
        admin: admin.clone(),
        receipt_links,
        auth: args.api_auth,
        rate_limit: args.api_rate_limit.0,
        ..ApiSettings::default()
    };
    let pool = api::connect(&db_args.database_url, &settings);
    let app = Application::build(pool, settings, listener)?;
    // On stdout, for people and scripts that asked for port 0.
    println!("serving the order API on http://{}", app.local_addr());
    if args.api_auth == ApiAuth::None {
        println!("WARNING: API_AUTH=none: the order API asks no one for a key");
    }
    if admin.is_some() {
        println!("dashboard on http://{}/admin", app.local_addr());
    }
    app.run_until_stopped(shutdown).await?;
    Ok(())
}
