//! `outbox-relay serve`: the order HTTP API.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use crate::api::{self, ApiSettings, Application};
use crate::config::{
    AdminArgs, ConfigError, DEFAULT_API_ADDR, DatabaseArgs, EnqueueArgs, HttpLimitsArgs, LinkArgs,
    parse_positive_duration, parse_socket_addr,
};
use crate::db;

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
}

pub async fn run(db_args: DatabaseArgs, args: ServeArgs) -> anyhow::Result<()> {
    // A port already taken is a deployment mistake: say so before migrating.
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .map_err(|e| ConfigError(format!("API_ADDR {}: cannot listen: {e}", args.addr)))?;

    // API_AUTH=none (keys off, receipts open) passes `false` here.
    let receipt_links = args.links.receipt_links(true, "serve")?;
    // Checked before the database is touched, like every other setting.
    let admin = args.admin.settings()?;

    let shutdown = crate::shutdown::on_signals();
    let migrated = db::migrate_when_writable(&db_args.database_url, &shutdown)
        .await
        .context("migrating the database")?;
    if !migrated {
        return Ok(());
    }

    let settings = ApiSettings {
        max_attempts: args.enqueue.max_attempts,
        request_timeout: args.request_timeout,
        connections: args.http.limits(),
        admin: admin.clone(),
        receipt_links,
        ..ApiSettings::default()
    };
    let pool = api::connect(&db_args.database_url, &settings);
    let app = Application::build(pool, settings, listener)?;
    // On stdout, for people and scripts that asked for port 0.
    println!("serving the order API on http://{}", app.local_addr());
    if admin.is_some() {
        println!("dashboard on http://{}/admin", app.local_addr());
    }
    app.run_until_stopped(shutdown).await?;
    Ok(())
}
