//! Typed settings from flags and the environment (the README, "Configuration"), validated
//! at start. Every flag also reads its environment variable; a bad value is a
//! clear error naming the flag, the variable and the value.
//!
//! A leaf: every part reads these types, and this module imports none of the
//! parts (only the leaves `kinds`, `client_addr` and `links`, and the core).
//! What a part makes of its settings (a mailer, a webhook client, the
//! connection limits) is that part's: `effects::settings`, `http_server`,
//! the commands.
//!
//! `relay`'s settings are in `relay.rs`, the effects' (which `demo` shares)
//! in `effects.rs`, the dashboard's that `serve` mounts in `admin.rs` and
//! `dashboard.rs`, the value parsers every flag uses in `parse.rs`,
//! `ORDER_PAYMENT_WINDOW` (`serve` and `relay`) in `payment_window.rs`. What
//! several commands share stays here.

mod admin;
pub mod dashboard;
mod database_url;
pub mod default_endpoint;
mod effects;
mod links;
mod parse;
mod payment_window;
mod reconcile;
mod relay;
mod secret_file;
mod secrets_key;

use std::time::Duration;

use clap::Args;

pub use admin::{AdminArgs, mail_from_domain};
pub use default_endpoint::DefaultEndpointArgs;
pub use effects::{EffectArgs, ReceiptArgs};
pub use links::LinkArgs;
pub use parse::{
    parse_count, parse_database_url, parse_duration, parse_http_url, parse_positive_duration,
    parse_proxy, parse_socket_addr, parse_url_without_credentials, redacted_proxy,
    refuse_placeholder,
};
use parse::{parse_fanout_inline, parse_max_attempts, parse_requests};
pub use payment_window::{
    MAX_PAYMENT_WINDOW, MIN_PAYMENT_WINDOW, PaymentWindow, PaymentWindowArgs, parse_payment_window,
};
pub use reconcile::{
    DEFAULT_STRIPE_API_BASE, ReconcileArgs, ReconcileEvery, StripeApiArgs, is_loopback,
    parse_api_base, parse_reconcile_every,
};
pub use relay::{RelayArgs, SessionTimeouts, default_worker_id};
pub use secret_file::{STDIN, read_secret_file};
pub use secrets_key::{PlaintextSecrets, SecretsKeyArgs};

pub const DEFAULT_API_ADDR: &str = "127.0.0.1:8080";
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9187";
/// `serve`'s `METRICS_ADDR`: beside a relay's on the same host.
pub const DEFAULT_API_METRICS_ADDR: &str = "127.0.0.1:9188";
pub const DEFAULT_PUBLIC_BASE_URL: &str = "http://127.0.0.1:8080";
pub const DEFAULT_WEBHOOK_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_MAX_CONNECTIONS: usize = 2048;
/// A client that talks to the API directly with a pool of keep-alive
/// connections holds a few dozen; a flood from one address holds no more.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 64;
pub const DEFAULT_MAX_REQUESTS_PER_CONNECTION: u64 = 1000;

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
    #[arg(long, env = "HTTP_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS, value_parser = parse_count)]
    pub http_max_connections: usize,
    /// Connections one client address may hold; past it that address's own
    /// longest-idle connection is closed first, and when all are busy the new
    /// one is. 0: no such cap. Loopback and TRUSTED_PROXIES (whose one address
    /// every client behind them shares) are never capped.
    #[arg(long, env = "HTTP_MAX_CONNECTIONS_PER_ADDRESS", default_value_t = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS)]
    pub http_max_connections_per_address: usize,
    /// Requests served on one keep-alive connection before it is closed.
    #[arg(long, env = "HTTP_MAX_REQUESTS_PER_CONNECTION", default_value_t = DEFAULT_MAX_REQUESTS_PER_CONNECTION, value_parser = parse_requests)]
    pub http_max_requests_per_connection: u64,
}

/// How this process queues the jobs of the order events it writes.
#[derive(Debug, Clone, Args)]
pub struct EnqueueArgs {
    /// max_attempts for new jobs.
    #[arg(long, env = "JOB_MAX_ATTEMPTS", default_value_t = outbox_core::outbox::DEFAULT_MAX_ATTEMPTS, value_parser = parse_max_attempts)]
    pub max_attempts: i32,
    /// Subscribed endpoints an event's own transaction writes deliveries
    /// for, at most; past it, one `order_fanout` job writes them after
    /// commit. 0: always after commit.
    #[arg(long, env = "FANOUT_INLINE", default_value_t = crate::orders::DEFAULT_FANOUT_INLINE, value_parser = parse_fanout_inline)]
    pub fanout_inline: usize,
}

impl EnqueueArgs {
    pub fn event_jobs(&self) -> crate::orders::EventJobs {
        crate::orders::EventJobs {
            max_attempts: self.max_attempts,
            fanout_inline: self.fanout_inline,
        }
    }
}

/// A configuration a relay cannot start with.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

// Here, not in `relay`'s tests, because the effects' tests (here and in
// `effects::settings`) parse `relay`'s flags too.
#[cfg(test)]
pub(crate) fn relay_args(args: &[&str]) -> Result<RelayArgs, clap::Error> {
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
