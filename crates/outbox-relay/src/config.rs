//! Typed settings from flags and the environment (the README, "Configuration"), validated
//! at start. Every flag also reads its environment variable; a bad value is a
//! clear error naming the flag, the variable and the value.
//!
//! `relay`'s settings are in `relay.rs`, the effects' (which `demo` shares)
//! in `effects.rs`, the dashboard's that `serve` mounts in `admin.rs`, the
//! value parsers every flag uses in `parse.rs`. What several commands share
//! stays here.

mod admin;
pub mod dashboard;
mod database_url;
pub mod default_endpoint;
mod effects;
mod links;
mod parse;
mod relay;

use std::time::Duration;

use clap::Args;

use crate::http_server::{self, ConnectionLimits};

pub use admin::AdminArgs;
pub use default_endpoint::DefaultEndpointArgs;
pub use effects::{EffectArgs, ReceiptArgs};
pub use links::LinkArgs;
pub use parse::{
    parse_count, parse_database_url, parse_duration, parse_http_url, parse_positive_duration,
    parse_socket_addr,
};
use parse::{parse_max_attempts, parse_requests};
pub use relay::{RelayArgs, SessionTimeouts, default_worker_id};

pub const DEFAULT_API_ADDR: &str = "127.0.0.1:8080";
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9187";
pub const DEFAULT_PUBLIC_BASE_URL: &str = "http://127.0.0.1:8080";
pub const DEFAULT_WEBHOOK_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// PostgreSQL URL.
    #[arg(long, env = "DATABASE_URL", value_parser = parse_database_url, hide_env_values = true)]
    pub database_url: String,
}

/// What a client of an HTTP listener (`serve`'s API, the relay's metrics
/// port) may hold, and for how long.
#[derive(Debug, Clone, Args)]
pub struct HttpLimitsArgs {
    /// Longest wait for a request's headers, on a new connection or an idle
    /// keep-alive one; past it the connection is closed.
    #[arg(long, env = "HTTP_HEADER_TIMEOUT", default_value = "10s", value_parser = parse_positive_duration)]
    pub http_header_timeout: Duration,
    /// Longest a response may wait for the client to read any of it; past it
    /// the connection is closed (a client that never reads keeps no slot).
    #[arg(long, env = "HTTP_WRITE_TIMEOUT", default_value = "30s", value_parser = parse_positive_duration)]
    pub http_write_timeout: Duration,
    /// Connections open at once at most (lowered to fit the open-files
    /// limit); past it the longest-idle connection (a half-open one, or an
    /// idle keep-alive one) is closed for the new one, and only when every
    /// connection has a request in flight do new ones wait in the backlog.
    #[arg(long, env = "HTTP_MAX_CONNECTIONS", default_value_t = http_server::DEFAULT_MAX_CONNECTIONS, value_parser = parse_count)]
    pub http_max_connections: usize,
    /// Connections one client address may hold; past it that address's own
    /// longest-idle connection is closed first. 0 (the default): no such cap,
    /// as behind a proxy, whose one address every client shares.
    #[arg(long, env = "HTTP_MAX_CONNECTIONS_PER_ADDRESS", default_value_t = 0)]
    pub http_max_connections_per_address: usize,
    /// Requests served on one keep-alive connection before it is closed.
    #[arg(long, env = "HTTP_MAX_REQUESTS_PER_CONNECTION", default_value_t = http_server::DEFAULT_MAX_REQUESTS_PER_CONNECTION, value_parser = parse_requests)]
    pub http_max_requests_per_connection: u64,
}

impl HttpLimitsArgs {
    pub fn limits(&self) -> ConnectionLimits {
        ConnectionLimits {
            header_timeout: self.http_header_timeout,
            write_timeout: self.http_write_timeout,
            max_connections: self.http_max_connections,
            max_connections_per_address: self.http_max_connections_per_address,
            max_requests_per_connection: self.http_max_requests_per_connection,
        }
    }
}

/// `max_attempts` given to jobs enqueued by this process.
#[derive(Debug, Clone, Args)]
pub struct EnqueueArgs {
    /// max_attempts for new jobs.
    #[arg(long, env = "JOB_MAX_ATTEMPTS", default_value_t = crate::outbox::DEFAULT_MAX_ATTEMPTS, value_parser = parse_max_attempts)]
    pub max_attempts: i32,
}

/// A configuration a relay cannot start with.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

// Here, not in `relay`'s tests, because the effects' tests parse `relay`'s flags too.
#[cfg(test)]
fn relay_args(args: &[&str]) -> Result<RelayArgs, clap::Error> {
    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        relay: RelayArgs,
    }
    use clap::Parser as _;
    let mut argv = vec!["relay"];
    argv.extend_from_slice(args);
    Cli::try_parse_from(argv).map(|cli| cli.relay)
}
