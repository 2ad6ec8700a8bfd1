//! `outbox-relay keys …`: API keys for the order API.
//!
//! Like `jobs`, each command opens one connection of its own and never
//! migrates: `serve`, `relay` and `migrate` do that.

use std::time::Duration;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use serde::Serialize;

use crate::api_keys::{
    self, ApiKey, CreateKeyError, KeyName, RevokeError, Revoked, Scope, parse_scopes,
};
use crate::cli::table::{Align, print_list};
use crate::cli::with_conn;
use crate::config::{ConfigError, DatabaseArgs, parse_positive_duration};

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create an API key and print it, once: only its hash is stored.
    ///
    /// Scopes: orders:place, orders:read, orders:pay, orders:ship,
    /// orders:deliver, orders:cancel, and orders:* for all of them.
    #[command(after_help = "Examples:\n  \
        outbox-relay keys create --name shop --scopes orders:place,orders:read\n  \
        outbox-relay keys create --name payments --scopes orders:pay --expires-in 90d\n  \
        outbox-relay keys create --name warehouse --scopes orders:ship,orders:deliver --json | jq -r .key")]
    Create(CreateArgs),
    /// Every key: name, scopes, created, last used (to the minute), expiry, revoked.
    List(ListArgs),
    /// Revoke a key: every replica refuses it from its next request on.
    Revoke(RevokeArgs),
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// A name for the key, unique: who uses it (shop, payments, warehouse).
    #[arg(long, value_parser = parse_name)]
    name: KeyName,
    /// What the key may do, comma-separated (orders:place,orders:read).
    #[arg(long, value_parser = parse_scopes_arg)]
    scopes: Scopes,
    /// The key stops working after this long: 90d, 12h (default: never).
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    expires_in: Option<Duration>,
    /// Print {"id","name","key","scopes"} as JSON on stdout, for scripts.
    #[arg(long)]
    json: bool,
}

/// The parsed `--scopes` (clap needs one value type per flag, not a Vec).
#[derive(Debug, Clone)]
struct Scopes(Vec<Scope>);

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct RevokeArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// The key's name, as `keys list` shows it.
    #[arg(value_name = "NAME")]
    name: String,
}

fn parse_name(raw: &str) -> Result<KeyName, String> {
    KeyName::parse(raw)
}

fn parse_scopes_arg(raw: &str) -> Result<Scopes, String> {
    parse_scopes(raw).map(Scopes)
}

pub async fn run(command: KeysCommand) -> anyhow::Result<()> {
    match command {
        KeysCommand::Create(args) => create(args).await,
        KeysCommand::List(args) => list(args).await,
        KeysCommand::Revoke(args) => revoke(args).await,
    }
}

#[derive(Debug, Serialize)]
struct CreatedJson<'a> {
    id: i64,
    name: &'a str,
    key: &'a str,
    scopes: Vec<&'static str>,
}

async fn create(args: CreateArgs) -> anyhow::Result<()> {
    let expires_at = match args.expires_in {
        None => None,
        Some(d) => Some(
            chrono::Duration::from_std(d)
                .ok()
                .and_then(|d| Utc::now().checked_add_signed(d))
                .ok_or_else(|| {
                    ConfigError(format!(
                        "--expires-in {}: too far in the future",
                        humantime::format_duration(d)
                    ))
                })?,
        ),
    };
    let (name, scopes) = (args.name, args.scopes.0);
    let created = with_conn(&args.db, move |conn| {
        api_keys::create_key(conn, &name, &scopes, expires_at).map_err(|e| match e {
            CreateKeyError::DuplicateName(_) => anyhow::Error::new(ConfigError(e.to_string())),
            other => anyhow::Error::new(other).context("creating the key"),
        })
    })
    .await?;
    let scopes: Vec<&'static str> = created.scopes.iter().map(|s| s.as_str()).collect();
    if args.json {
        let json = CreatedJson {
            id: created.id,
            name: &created.name,
            key: created.secret.expose(),
            scopes,
        };
        println!("{}", serde_json::to_string(&json)?);
        return Ok(());
    }
    println!("created API key {:?} (id {})", created.name, created.id);
    println!("scopes:  {}", scopes.join(", "));
    println!("expires: {}", when(created.expires_at, "never"));
    println!();
    println!("{}", created.secret.expose());
    println!();
    println!("This is the only time the key is shown: only its hash is stored.");
    println!("Send it as: Authorization: Bearer <key>");
    Ok(())
}

async fn list(args: ListArgs) -> anyhow::Result<()> {
    let keys: Vec<ApiKey> = with_conn(&args.db, |conn| {
        api_keys::list_keys(conn).context("reading api_keys")
    })
    .await?;
    print_list(
        &keys,
        args.json,
        "no API keys; create one with `outbox-relay keys create --name N --scopes S`",
        &[
            ("NAME", Align::Left),
            ("SCOPES", Align::Left),
            ("CREATED", Align::Left),
            ("LAST USED", Align::Left),
            ("EXPIRES", Align::Left),
            ("REVOKED", Align::Left),
        ],
        |key| {
            vec![
                key.name.clone(),
                key.scopes.join(","),
                when(Some(key.created_at), "-"),
                when(key.last_used_at, "never"),
                when(key.expires_at, "never"),
                when(key.revoked_at, "-"),
            ]
        },
    )
}

async fn revoke(args: RevokeArgs) -> anyhow::Result<()> {
    let name = args.name.clone();
    let outcome = with_conn(&args.db, move |conn| {
        api_keys::revoke_key(conn, &name).map_err(|e| match e {
            RevokeError::NotFound(_) => anyhow::Error::new(ConfigError(e.to_string())),
            other => anyhow::Error::new(other).context("revoking the key"),
        })
    })
    .await?;
    match outcome {
        Revoked::Now(at) => println!("revoked API key {:?} at {}", args.name, stamp(at)),
        Revoked::Already(at) => println!(
            "API key {:?} was already revoked at {}",
            args.name,
            stamp(at)
        ),
    }
    Ok(())
}

fn stamp(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%SZ").to_string()
}

fn when(at: Option<DateTime<Utc>>, none: &str) -> String {
    at.map_or_else(|| none.to_owned(), stamp)
}
