//! `outbox-relay endpoints ...`: the subscribers order events are delivered to.
//!
//! Each command opens one connection of its own, as the `jobs` commands do.
//! A value that does not parse is refused before anything is written, naming
//! its flag (exit 2); a refusal by the table (a name taken, deliveries still
//! queued) writes nothing either (exit 1). `add`, the one that checks a
//! NATS server before it writes, is in `endpoints/add.rs`.

mod add;

use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use self::add::AddArgs;
use crate::at_rest;
use crate::cli::secrets::refused_without_key;
use crate::cli::table::{Align, print_list};
use crate::cli::with_conn;
use crate::config::{ConfigError, DatabaseArgs, SecretsKeyArgs, parse_duration};
use crate::effects::nats;
use crate::effects::nats::connection::Auth;
use crate::endpoints::attempts::{self, AttemptStats};
use crate::endpoints::store::{self, Endpoint};
use crate::endpoints::{
    EndpointCredentials, RateLimit, SigningSecret, SpecError, nats_credentials, recover, spec,
};

#[derive(Debug, Subcommand)]
pub enum EndpointsCommand {
    /// Add a subscriber: a URL that receives the order events it subscribes to,
    /// signed with its own secret.
    ///
    /// Without --secret a new whsec_ secret is made and printed once: give it
    /// to the receiver, which verifies every delivery with it.
    #[command(after_help = "Examples:\n  \
        outbox-relay endpoints add --name erp --url https://erp.example.com/hooks/orders\n  \
        outbox-relay endpoints add --name fulfilment --url https://ship.example.com/in \\\n      \
        --events order.paid,order.cancelled --rate-limit 5/s --max-in-flight 4\n  \
        outbox-relay endpoints add --name events --url nats://127.0.0.1:4222 \\\n      \
        --stream ORDERS --subject-prefix orders --create-stream")]
    // Boxed: its many flags would make every command as large as it.
    Add(Box<AddArgs>),
    /// Change a NATS endpoint's own credentials (checked against its server
    /// first) or clear them. Relays use the new ones within seconds.
    #[command(after_help = "Examples:\n  \
        outbox-relay endpoints update events --nats-credentials events.creds\n  \
        outbox-relay endpoints update events --nats-user relay --nats-password-file pass.txt\n  \
        outbox-relay endpoints update events --clear-nats-credentials")]
    Update(UpdateArgs),
    /// Every endpoint, with its state, limits, and its recent attempts:
    /// how many, the share that succeeded, and their p95 duration.
    List(ListArgs),
    /// Stop delivering to an endpoint: its deliveries wait, in order, until it is enabled.
    Disable(NameArgs),
    /// Deliver to an endpoint again, releasing what waited, in order.
    Enable(NameArgs),
    /// Remove an endpoint. With unfinished deliveries to it, --force cancels them too.
    Remove(RemoveArgs),
    /// Give an endpoint a new secret, printed once; the old one signs beside it until --keep-old passes.
    RotateSecret(RotateArgs),
    /// Put an endpoint's failed deliveries since a time back to pending, once
    /// each, oldest first (each order's deliveries stay in order).
    #[command(after_help = "Examples:\n  \
        outbox-relay endpoints recover erp --since 6h --dry-run\n  \
        outbox-relay endpoints recover erp --since 2d")]
    Recover(RecoverArgs),
}

#[derive(Debug, Args)]
pub struct RecoverArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// The endpoint's name.
    name: String,
    /// Deliveries that failed within this long before now: 6h, 2d, 90m.
    #[arg(long, value_parser = parse_duration)]
    since: Duration,
    /// Count them, and change nothing.
    #[arg(long)]
    dry_run: bool,
}

/// A NATS endpoint's own credentials, stored with it and presented only to
/// its server (without them: the relay's `NATS_CREDENTIALS`). Read from
/// files, so that no secret is on a command line.
#[derive(Debug, Args)]
pub struct CredentialArgs {
    /// NATS endpoints: a .creds file (a user JWT and its nkey seed, as nsc
    /// writes it) whose content is stored with the endpoint.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["nats_user", "nats_token_file"])]
    nats_credentials: Option<std::path::PathBuf>,
    /// NATS endpoints: a user of the server's authorization block (with
    /// --nats-password-file).
    #[arg(
        long,
        value_name = "USER",
        requires = "nats_password_file",
        conflicts_with = "nats_token_file"
    )]
    nats_user: Option<String>,
    /// NATS endpoints: a file whose first line is --nats-user's password.
    #[arg(long, value_name = "FILE", requires = "nats_user")]
    nats_password_file: Option<std::path::PathBuf>,
    /// NATS endpoints: a file whose first line is the server's token.
    #[arg(long, value_name = "FILE")]
    nats_token_file: Option<std::path::PathBuf>,
}

impl CredentialArgs {
    /// The credentials the flags give, read and checked; none without them.
    fn read(&self) -> Result<Option<EndpointCredentials>, SpecError> {
        let read = |flag: &'static str, path: &std::path::Path| {
            std::fs::read_to_string(path).map_err(|e| SpecError {
                flag,
                message: format!("cannot read {}: {e}", path.display()),
            })
        };
        if let Some(path) = &self.nats_credentials {
            return EndpointCredentials::creds(&read("--nats-credentials", path)?).map(Some);
        }
        if let (Some(user), Some(path)) = (&self.nats_user, &self.nats_password_file) {
            let password = read("--nats-password-file", path)?;
            return EndpointCredentials::user_password(user, &password).map(Some);
        }
        if let Some(path) = &self.nats_token_file {
            return EndpointCredentials::token(&read("--nats-token-file", path)?).map(Some);
        }
        Ok(None)
    }

    fn given(&self) -> Option<&'static str> {
        if self.nats_credentials.is_some() {
            Some("--nats-credentials")
        } else if self.nats_user.is_some() {
            Some("--nats-user")
        } else if self.nats_token_file.is_some() {
            Some("--nats-token-file")
        } else {
            None
        }
    }
}

#[derive(Debug, Args)]
pub struct UpdateArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// The endpoint's name.
    name: String,
    #[command(flatten)]
    credentials: CredentialArgs,
    /// NATS endpoints: forget the endpoint's own credentials; its connection
    /// then presents the relay's NATS_CREDENTIALS, if any.
    #[arg(long, conflicts_with_all = ["nats_credentials", "nats_user", "nats_token_file"])]
    clear_nats_credentials: bool,
    /// Allow a NATS server on a loopback, private or link-local address.
    #[arg(long, env = "WEBHOOK_ALLOW_PRIVATE", default_value_t = false, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    allow_private: bool,
    #[command(flatten)]
    secrets: SecretsKeyArgs,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct NameArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// The endpoint's name.
    name: String,
}

#[derive(Debug, Args)]
pub struct RemoveArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// The endpoint's name.
    name: String,
    /// Also cancel its unfinished deliveries.
    #[arg(long)]
    force: bool,
}

#[derive(Debug, Args)]
pub struct RotateArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// The endpoint's name.
    name: String,
    /// How long the old secret still signs beside the new one (0s: not at all).
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    keep_old: Duration,
    /// Print {"id","name","secret"} as JSON instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    secrets: SecretsKeyArgs,
}

pub async fn run(command: EndpointsCommand) -> anyhow::Result<()> {
    match command {
        EndpointsCommand::Add(args) => add::add(*args).await,
        EndpointsCommand::Update(args) => update(args).await,
        EndpointsCommand::List(args) => list(args).await,
        EndpointsCommand::Disable(args) => set_enabled(args, false).await,
        EndpointsCommand::Enable(args) => set_enabled(args, true).await,
        EndpointsCommand::Remove(args) => remove(args).await,
        EndpointsCommand::RotateSecret(args) => rotate(args).await,
        EndpointsCommand::Recover(args) => recover(args).await,
    }
}

fn usage(error: SpecError) -> anyhow::Error {
    ConfigError(error.to_string()).into()
}

fn new_secret() -> Result<SigningSecret, SpecError> {
    SigningSecret::generate().map_err(|e| SpecError {
        flag: "--secret",
        message: format!("no randomness to make a secret with ({e}); give one with --secret"),
    })
}

fn print_secret(endpoint: &Endpoint, secret: &SigningSecret, json: bool) -> anyhow::Result<()> {
    super::table::print_secret(
        endpoint.id,
        &endpoint.name,
        secret.expose(),
        json,
        true,
        "(shown once: give it to the receiver, which verifies each delivery with it)",
    )
}

pub(super) fn events_of(endpoint: &Endpoint) -> String {
    endpoint
        .event_types
        .as_ref()
        .map_or_else(|| "every event".to_owned(), |types| types.join(","))
}

fn rate_of(endpoint: &Endpoint) -> String {
    endpoint.rate_limit.map_or_else(
        || "-".to_owned(),
        |rate| RateLimit::from_per_second(rate).to_string(),
    )
}

/// A row of `endpoints list`: the endpoint, whether it has NATS credentials
/// of its own (never what they are), and its recent attempts.
#[derive(serde::Serialize)]
struct Listed {
    #[serde(flatten)]
    endpoint: Endpoint,
    /// `set` or `not set` for a NATS endpoint; absent for a webhook.
    #[serde(skip_serializing_if = "Option::is_none")]
    nats_credentials: Option<&'static str>,
    #[serde(flatten)]
    stats: AttemptStats,
}

async fn list(args: ListArgs) -> anyhow::Result<()> {
    let listed = with_conn(&args.db, |conn| {
        let endpoints = store::list(conn).context("reading endpoints")?;
        let with_credentials = nats_credentials::which_set(conn).context("reading endpoints")?;
        let mut stats = attempts::stats(conn).context("reading delivery attempts")?;
        Ok(endpoints
            .into_iter()
            .map(|endpoint| Listed {
                nats_credentials: endpoint.url.starts_with("nats://").then(|| {
                    if with_credentials.contains(&endpoint.id) {
                        "set"
                    } else {
                        "not set"
                    }
                }),
                stats: stats.remove(&endpoint.id).unwrap_or_default(),
                endpoint,
            })
            .collect::<Vec<_>>())
    })
    .await?;
    print_list(
        &listed,
        args.json,
        "no endpoints (add one with `outbox-relay endpoints add`)",
        &[
            ("NAME", Align::Left),
            ("STATE", Align::Left),
            ("URL", Align::Left),
            ("EVENTS", Align::Left),
            ("RATE", Align::Right),
            ("IN FLIGHT", Align::Right),
            ("FAILING SINCE", Align::Left),
            ("ATTEMPTS", Align::Right),
            ("OK", Align::Right),
            ("P95", Align::Right),
            ("NATS CREDENTIALS", Align::Left),
        ],
        |l| {
            let e = &l.endpoint;
            vec![
                e.name.clone(),
                e.state(),
                crate::endpoints::spec::without_userinfo(&e.url),
                events_of(e),
                rate_of(e),
                e.max_in_flight.to_string(),
                e.failing_since.map_or_else(
                    || "-".to_owned(),
                    |t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
                ),
                l.stats.attempts.to_string(),
                l.stats
                    .success_rate
                    .map_or_else(|| "-".to_owned(), |r| format!("{:.1}%", r * 100.0)),
                l.stats
                    .p95_ms
                    .map_or_else(|| "-".to_owned(), |p| format!("{p:.0} ms")),
                l.nats_credentials.unwrap_or("-").to_owned(),
            ]
        },
    )
}

/// Sets or clears a NATS endpoint's own credentials, after its server took
/// the new ones.
async fn update(args: UpdateArgs) -> anyhow::Result<()> {
    let own = args.credentials.read().map_err(usage)?;
    let keys = args.secrets.keyring()?;
    if own.is_none() && !args.clear_nats_credentials {
        return Err(ConfigError(
            "nothing to update: give --nats-credentials FILE, --nats-user USER \
             --nats-password-file FILE, --nats-token-file FILE or --clear-nats-credentials"
                .to_owned(),
        )
        .into());
    }
    let name = args.name.clone();
    let endpoint = with_conn(&args.db, move |conn| {
        store::find(conn, &name).map_err(anyhow::Error::from)
    })
    .await?;
    if !endpoint.url.starts_with("nats://") {
        let flag = args
            .credentials
            .given()
            .unwrap_or("--clear-nats-credentials");
        return Err(usage(SpecError {
            flag,
            message: format!(
                "is for nats:// endpoints only; {} is {}",
                endpoint.name,
                spec::without_userinfo(&endpoint.url)
            ),
        }));
    }
    if let Some(own) = &own {
        let transport = nats::connection::Transport {
            plaintext: endpoint.allow_http,
            allow_private: args.allow_private,
        };
        nats::connection::connect_once(&endpoint.url, &Auth::Endpoint(own.clone()), transport)
            .await
            .map_err(|e| {
                ConfigError(format!(
                    "endpoint {:?} ({}): {e}; nothing changed",
                    endpoint.name, endpoint.url
                ))
            })?;
    }
    let id = endpoint.id;
    let stored = own.clone();
    with_conn(&args.db, move |conn| {
        if stored.is_some() {
            at_rest::require_key_where_sealed(conn, &keys).map_err(refused_without_key)?;
        }
        nats_credentials::set(conn, id, stored.as_ref(), &keys)
            .context("storing the NATS credentials")
    })
    .await?;
    match own {
        Some(own) => println!(
            "endpoint {} now presents its own NATS credentials ({})",
            endpoint.name,
            own.kind()
        ),
        None => println!(
            "endpoint {} no longer has NATS credentials of its own (NATS_CREDENTIALS, if set, \
             applies)",
            endpoint.name
        ),
    }
    Ok(())
}

async fn set_enabled(args: NameArgs, enabled: bool) -> anyhow::Result<()> {
    let name = args.name.clone();
    let endpoint = with_conn(&args.db, move |conn| {
        store::set_enabled(conn, &name, enabled).map_err(anyhow::Error::from)
    })
    .await?;
    println!("endpoint {} is {}", endpoint.name, endpoint.state());
    Ok(())
}

async fn remove(args: RemoveArgs) -> anyhow::Result<()> {
    let (name, force) = (args.name.clone(), args.force);
    let removed = with_conn(&args.db, move |conn| {
        store::remove(conn, &name, force).map_err(anyhow::Error::from)
    })
    .await?;
    match removed.cancelled.len() {
        0 => println!("removed endpoint {}", removed.endpoint.name),
        n => println!(
            "removed endpoint {} and cancelled its {n} unfinished deliveries",
            removed.endpoint.name
        ),
    }
    Ok(())
}

async fn rotate(args: RotateArgs) -> anyhow::Result<()> {
    let secret = new_secret().map_err(usage)?;
    let keys = args.secrets.keyring()?;
    let (name, keep_old, made) = (args.name.clone(), args.keep_old, secret.clone());
    let endpoint = with_conn(&args.db, move |conn| {
        at_rest::require_key_where_sealed(conn, &keys).map_err(refused_without_key)?;
        store::rotate_secret(conn, &name, &made, keep_old, &keys).map_err(anyhow::Error::from)
    })
    .await?;
    if !args.json {
        match endpoint.previous_secret_expires_at {
            Some(until) => println!(
                "rotated the secret of {}; the old one also signs until {}",
                endpoint.name,
                until.format("%Y-%m-%d %H:%M:%S UTC")
            ),
            None => println!(
                "rotated the secret of {}; the old one no longer signs",
                endpoint.name
            ),
        }
    }
    print_secret(&endpoint, &secret, args.json)
}

async fn recover(args: RecoverArgs) -> anyhow::Result<()> {
    let since = chrono::Duration::from_std(args.since)
        .ok()
        .and_then(|age| chrono::Utc::now().checked_sub_signed(age))
        .ok_or_else(|| ConfigError(format!("--since {:?}: too far back", args.since)))?;
    let (name, dry_run) = (args.name.clone(), args.dry_run);
    // A dry run counts; a recovery returns the ids it put back.
    let (count, ids) = with_conn(&args.db, move |conn| {
        if dry_run {
            recover::preview(conn, &name, recover::Window::since(since)).map(|n| (n, Vec::new()))
        } else {
            recover::recover(conn, &name, recover::Window::since(since)).map(|ids| (ids.len(), ids))
        }
        .map_err(anyhow::Error::from)
    })
    .await?;
    let since = since.format("%Y-%m-%d %H:%M:%S UTC");
    match (count, args.dry_run) {
        (0, _) => println!("{} has no failed deliveries since {since}", args.name),
        (n, true) => println!(
            "would put back {n} failed deliveries to {} since {since} (dry run: nothing changed)",
            args.name
        ),
        (n, false) => println!(
            "put back {n} failed deliveries to {} since {since}, oldest first: {}",
            args.name,
            ids.iter().map(i64::to_string).collect::<Vec<_>>().join(" ")
        ),
    }
    Ok(())
}
