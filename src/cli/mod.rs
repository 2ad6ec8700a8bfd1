//! The `outbox-relay` command line: the subcommands of the README's "Configuration" and of docs/operations.md.

mod default_endpoint;
mod endpoints;
mod inbox;
mod jobs;
mod keys;
mod orders;
mod relay;
mod secrets;
mod serve;
mod sources;
mod table;

use std::process::ExitCode;

use clap::{CommandFactory as _, Parser, Subcommand};

use crate::config::{ConfigError, DatabaseArgs, RelayArgs, SecretsKeyArgs};

pub use endpoints::EndpointsCommand;
pub use inbox::InboxCommand;
pub use jobs::JobsCommand;
pub use keys::KeysCommand;
pub use orders::OrdersCommand;
pub use secrets::SecretsCommand;
pub use serve::ServeArgs;
pub use sources::SourcesCommand;

#[derive(Debug, Parser)]
#[command(
    name = "outbox-relay",
    version,
    about = "A transactional outbox for order workflows on PostgreSQL."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply pending database migrations (also done at the start of serve, relay and demo).
    Migrate {
        #[command(flatten)]
        db: DatabaseArgs,
        #[command(flatten)]
        default: crate::config::DefaultEndpointArgs,
        #[command(flatten)]
        secrets: SecretsKeyArgs,
    },
    /// Run the worker pool: claim jobs and perform their effects until SIGTERM/SIGINT.
    Relay {
        #[command(flatten)]
        db: DatabaseArgs,
        #[command(flatten)]
        args: Box<RelayArgs>,
        #[command(flatten)]
        secrets: SecretsKeyArgs,
    },
    /// Measure drain throughput against the raw-SQL ceiling, enqueue-to-start
    /// latency, and the relay's RSS, CPU, transactions and WAL per job.
    #[cfg(feature = "dev-tools")]
    Bench {
        #[command(flatten)]
        args: Box<crate::bench::BenchArgs>,
    },
    /// Serve the order HTTP API (POST /orders, GET /orders/{id}, its receipt, /healthz; /metrics on METRICS_ADDR)
    /// until SIGTERM/SIGINT.
    Serve {
        #[command(flatten)]
        db: DatabaseArgs,
        #[command(flatten)]
        args: Box<ServeArgs>,
    },
    /// Inspect and repair the jobs table: stats, list, retry, prune.
    Jobs {
        #[command(subcommand)]
        command: JobsCommand,
    },
    /// Manage the subscribers order events are delivered to: add, list, enable,
    /// disable, remove, rotate-secret.
    ///
    /// Each order event is delivered to every enabled endpoint subscribed to
    /// its type, signed with that endpoint's secrets. WEBHOOK_URL and
    /// WEBHOOK_SECRET keep the endpoint `default`.
    Endpoints {
        #[command(subcommand)]
        command: EndpointsCommand,
    },
    /// Look into an order: its effect ledger (`orders effects ID`).
    Orders {
        #[command(subcommand)]
        command: OrdersCommand,
    },
    /// Create, list and revoke the API keys of the order API.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Manage the senders of inbound events (payment providers) that POST
    /// to /inbound/<name>: add, list, rotate-secret, remove.
    Sources {
        #[command(subcommand)]
        command: SourcesCommand,
    },
    /// The messages received from sources: list them, and apply or dismiss
    /// a held one.
    Inbox {
        #[command(subcommand)]
        command: InboxCommand,
    },
    /// The endpoints' and sources' secrets at rest: seal every one under
    /// SECRETS_KEY.
    Secrets {
        #[command(subcommand)]
        command: SecretsCommand,
    },
    /// Run everything end to end with nothing to set up: a private PostgreSQL (unless
    /// DATABASE_URL is set), the API, a relay, local mail and webhook sinks, sample orders.
    #[cfg(feature = "dev-tools")]
    Demo {
        #[command(flatten)]
        args: Box<crate::demo::DemoArgs>,
    },
}

/// Exit status for bad configuration or arguments (as clap uses for usage errors).
const EXIT_USAGE: u8 = 2;

/// Parses the command line, runs the command, and maps errors to exit codes:
/// 0 on success (a clean shutdown included), 2 for bad arguments or
/// configuration, 1 for anything that failed while running.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage_error(error),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    // Only the services export traces; operator commands stay quiet.
    let exports = matches!(cli.command, Command::Serve { .. } | Command::Relay { .. });
    let otel = if exports {
        crate::otel::OtelSettings::from_env()
    } else {
        crate::otel::OtelSettings::default()
    };
    let default_filter = match cli.command {
        #[cfg(feature = "dev-tools")]
        Command::Bench { .. } => "warn",
        _ => "info",
    };
    let traces =
        crate::telemetry::init_tracing_with(default_filter, &otel, Some(runtime.handle().clone()));
    let outcome = runtime.block_on(run(cli));
    // Outside the runtime, which still runs the exporter's last calls.
    if let Some(traces) = traces {
        traces.shutdown();
    }
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if error.downcast_ref::<ConfigError>().is_some() => {
            eprintln!("error: {error}");
            ExitCode::from(EXIT_USAGE)
        }
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Migrate {
            db,
            default,
            secrets,
        } => {
            let endpoint = default_endpoint::checked(&default)?;
            let keys = secrets.keyring()?;
            let shutdown = crate::shutdown::on_signals();
            if crate::db::migrate_when_writable(&db.database_url, &shutdown).await? {
                default_endpoint::write(&db.database_url, endpoint, &keys).await?;
                println!("migrations applied");
            }
            Ok(())
        }
        Command::Relay { db, args, secrets } => relay::run(db, *args, secrets).await,
        #[cfg(feature = "dev-tools")]
        Command::Bench { args } => crate::bench::run(*args).await,
        Command::Serve { db, args } => serve::run(db, *args).await,
        Command::Jobs { command } => jobs::run(command).await,
        Command::Endpoints { command } => endpoints::run(command).await,
        Command::Orders { command } => orders::run(command).await,
        Command::Keys { command } => keys::run(command).await,
        Command::Sources { command } => sources::run(command).await,
        Command::Inbox { command } => inbox::run(command).await,
        Command::Secrets { command } => secrets::run(command).await,
        #[cfg(feature = "dev-tools")]
        Command::Demo { args } => crate::demo::run(*args).await,
    }
}

/// Runs `f` on a fresh connection of its own (an operator command needs no
/// pool and runs no migrations), on a blocking thread.
pub(crate) async fn with_conn<T, F>(db: &DatabaseArgs, f: F) -> anyhow::Result<T>
where
    F: FnOnce(&mut diesel::PgConnection) -> anyhow::Result<T> + Send + 'static,
    T: Send + 'static,
{
    let url = db.database_url.clone();
    tokio::task::spawn_blocking(move || {
        let mut conn = crate::db::establish(&url)?;
        f(&mut conn)
    })
    .await?
}

/// Prints clap's error, adding the environment variable a bad value came from,
/// so `RELAY_LEASE=soon` is reported as such and not only as `--lease`.
fn usage_error(error: clap::Error) -> ExitCode {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let code = match error.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = error.print();
            return ExitCode::SUCCESS;
        }
        _ => EXIT_USAGE,
    };
    // A value whose variable is hidden from --help (DATABASE_URL, SMTP_URL, the
    // secrets) may hold a password: give the reason without the value.
    if let Some(ContextValue::String(arg)) = error.get(ContextKind::InvalidArg)
        && let Some((env, true)) = env_var_of(arg)
        && error.get(ContextKind::InvalidValue).is_some()
    {
        let reason = std::error::Error::source(&error)
            .map(ToString::to_string)
            .unwrap_or_else(|| "not accepted".to_owned());
        eprintln!(
            "error: invalid value for '{arg}' ({env}; the value is not shown, as it may hold a password): {reason}"
        );
        return ExitCode::from(code);
    }
    let _ = error.print();
    if let (Some(ContextValue::String(arg)), Some(ContextValue::String(value))) = (
        error.get(ContextKind::InvalidArg),
        error.get(ContextKind::InvalidValue),
    ) && let Some((env, _)) = env_var_of(arg)
        && std::env::var(&env).is_ok_and(|v| &v == value)
    {
        eprintln!("note: the value {value:?} came from the environment variable {env}");
    }
    ExitCode::from(code)
}

/// The environment variable behind a flag as clap names it (`--lease <LEASE>`),
/// and whether its value is hidden from `--help`.
fn env_var_of(arg: &str) -> Option<(String, bool)> {
    let long = arg.trim_start_matches("--").split([' ', '=']).next()?;
    let command = Cli::command();
    let mut pending = vec![command];
    while let Some(cmd) = pending.pop() {
        for a in cmd.get_arguments() {
            if a.get_long() == Some(long)
                && let Some(env) = a.get_env()
            {
                return Some((
                    env.to_string_lossy().into_owned(),
                    a.is_hide_env_values_set(),
                ));
            }
        }
        pending.extend(cmd.get_subcommands().cloned());
    }
    None
}
