//! `outbox-relay serve`: the order HTTP API.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use crate::api::{self, ApiSettings, Application};
use crate::config::{
    AdminArgs, ConfigError, DEFAULT_API_ADDR, DatabaseArgs, DefaultEndpointArgs, EnqueueArgs,
    HttpLimitsArgs, parse_positive_duration, parse_socket_addr,
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
    pub default_endpoint: DefaultEndpointArgs,
}

pub async fn run(db_args: DatabaseArgs, args: ServeArgs) -> anyhow::Result<()> {
    let default_endpoint = args.default_endpoint.checked()?;
    // A port already taken is a deployment mistake: say so before migrating.
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .map_err(|e| ConfigError(format!("API_ADDR {}: cannot listen: {e}", args.addr)))?;

    let url = db_args.database_url.clone();
    tokio::task::spawn_blocking(move || db::migrate_url(&url))
        .await?
        .context("migrating the database")?;
    crate::config::default_endpoint::write_default(&db_args.database_url, default_endpoint).await?;

    let admin = args.admin.settings()?;
    let settings = ApiSettings {
        max_attempts: args.enqueue.max_attempts,
        request_timeout: args.request_timeout,
        connections: args.http.limits(),
        admin: admin.clone(),
        ..ApiSettings::default()
    };
    let pool = api::connect(&db_args.database_url, &settings);
    let app = Application::build(pool, settings, listener)?;
    // On stdout, for people and scripts that asked for port 0.
    println!("serving the order API on http://{}", app.local_addr());
    if admin.is_some() {
        println!("dashboard on http://{}/admin", app.local_addr());
    }
    app.run_until_stopped(crate::shutdown::on_signals()).await?;
    Ok(())
}
