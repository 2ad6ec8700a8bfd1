//! `outbox-relay sources ...`: the senders of inbound events
//! (`POST /inbound/{name}`), each with its kind and secrets.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use crate::at_rest;
use crate::cli::secrets::refused_without_key;
use crate::cli::table::{Align, print_list};
use crate::cli::with_conn;
use crate::config::{ConfigError, DatabaseArgs, SecretsKeyArgs, parse_duration, read_secret_file};
use crate::inbox::reconcile::api_key;
use crate::inbox::source::{self, Source, SourceError, SourceKind, SourceMode};

#[derive(Debug, Subcommand)]
pub enum SourcesCommand {
    /// Add a sender of signed webhooks (a payment provider): its events go
    /// to POST /inbound/<name>.
    ///
    /// For Stripe, give the endpoint's signing secret (whsec_…) with
    /// --secret-file (or --secret). Without either a new whsec_ secret is
    /// made and printed once: give it to the sender.
    #[command(after_help = "Examples:\n  \
        outbox-relay sources add --name stripe --kind stripe --mode live --secret-file stripe.secret\n  \
        pass show shop/stripe-webhook | outbox-relay sources add --name stripe --kind stripe --secret-file -\n  \
        outbox-relay sources add --name billing --kind standard")]
    Add(AddArgs),
    /// Every source, with its kind and secret rotation.
    List(ListArgs),
    /// Give a source a new secret; the old one still verifies until --keep-old passes.
    RotateSecret(RotateArgs),
    /// Remove a source: its URL answers 401 from now on.
    Remove(NameArgs),
    /// Give a stripe source the API key that reads its event log, so that
    /// `inbox reconcile` and the relays recover events its webhooks missed.
    #[command(after_help = "Examples:\n  \
        outbox-relay sources set-api-key stripe --api-key-file stripe-events.key\n  \
        pass show shop/stripe-restricted-key | outbox-relay sources set-api-key stripe --api-key-file -")]
    SetApiKey(SetApiKeyArgs),
}

#[derive(Debug, Args)]
pub struct AddArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// A unique name (letters, digits, '_', '.', '-'): the last part of its URL.
    #[arg(long)]
    name: String,
    /// How its messages are signed.
    #[arg(long, value_enum)]
    kind: SourceKind,
    /// Stripe sources: the events it applies, by their livemode (live, test
    /// or any). An event of the other mode is stored ignored, with the reason.
    #[arg(long, value_enum, default_value_t = SourceMode::Any)]
    mode: SourceMode,
    #[command(flatten)]
    secret: SecretArgs,
    /// Stripe sources: a file holding the API key that reads its event log
    /// (a restricted key with read access to events is enough), or - for
    /// standard input. The source is then reconciled.
    #[arg(long, value_name = "PATH")]
    api_key_file: Option<PathBuf>,
    /// Print {"id","name","secret"} as JSON instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    secrets: SecretsKeyArgs,
}

#[derive(Debug, Args)]
pub struct SetApiKeyArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// The source's name.
    name: String,
    /// A file holding the API key (one trailing newline is ignored), or -
    /// for standard input.
    #[arg(long, value_name = "PATH")]
    api_key_file: PathBuf,
    #[command(flatten)]
    secrets: SecretsKeyArgs,
}

/// The secret given, on the command line or (never seen by `ps` or a
/// shell's history) in a file; made for you when neither is.
#[derive(Debug, Args)]
pub struct SecretArgs {
    /// The signing secret: Stripe's whsec_… as shown by Stripe; for standard,
    /// whsec_ and base64. Shows in `ps` and shell history: prefer --secret-file.
    #[arg(long, conflicts_with = "secret_file")]
    secret: Option<String>,
    /// A file holding the signing secret (one trailing newline is ignored),
    /// or - for standard input.
    #[arg(long, value_name = "PATH")]
    secret_file: Option<PathBuf>,
}

impl SecretArgs {
    /// The secret as given, and the flag that gave it; `None` for neither.
    fn given(&self) -> anyhow::Result<Option<(String, &'static str)>> {
        match (&self.secret, &self.secret_file) {
            (Some(raw), _) => Ok(Some((raw.clone(), "--secret"))),
            (None, Some(path)) => Ok(Some((
                read_secret_file("--secret-file", path)?,
                "--secret-file",
            ))),
            (None, None) => Ok(None),
        }
    }
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
    /// The source's name.
    name: String,
}

#[derive(Debug, Args)]
pub struct RotateArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// The source's name.
    name: String,
    /// The new secret (Stripe's, after "Roll secret"); made for you when left out.
    #[command(flatten)]
    secret: SecretArgs,
    /// How long the old secret still verifies beside the new one (0s: not at all).
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    keep_old: Duration,
    /// Print {"id","name","secret"} as JSON instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    secrets: SecretsKeyArgs,
}

pub async fn run(command: SourcesCommand) -> anyhow::Result<()> {
    match command {
        SourcesCommand::Add(args) => add(args).await,
        SourcesCommand::List(args) => list(args).await,
        SourcesCommand::RotateSecret(args) => rotate(args).await,
        SourcesCommand::Remove(args) => remove(args).await,
        SourcesCommand::SetApiKey(args) => set_api_key(args).await,
    }
}

/// A bad flag is a usage error (exit 2); the rest fail the command (exit 1).
fn refusal(error: SourceError) -> anyhow::Error {
    match error {
        SourceError::BadName(_)
        | SourceError::BadSecret { .. }
        | SourceError::ModeOfStandard(_)
        | SourceError::ApiKeyOfStandard(_) => ConfigError(error.to_string()).into(),
        other => other.into(),
    }
}

/// The secret given, checked for the source's kind, or a new one.
fn secret_for(
    kind: SourceKind,
    given: Option<(String, &'static str)>,
) -> anyhow::Result<(String, bool)> {
    match given {
        Some((raw, flag)) => Ok((
            source::check_secret(kind, &raw, flag).map_err(refusal)?,
            false,
        )),
        None => Ok((source::new_secret().map_err(refusal)?, true)),
    }
}

async fn add(args: AddArgs) -> anyhow::Result<()> {
    source::check_name(&args.name).map_err(refusal)?;
    source::check_mode(args.kind, args.mode).map_err(refusal)?;
    let stdin = Some(std::path::Path::new(crate::config::STDIN));
    if args.secret.secret_file.as_deref() == stdin && args.api_key_file.as_deref() == stdin {
        return Err(ConfigError(
            "--secret-file - and --api-key-file -: standard input holds one of them; give the \
             other in a file"
                .into(),
        )
        .into());
    }
    let (secret, made) = secret_for(args.kind, args.secret.given()?)?;
    let api_key = match &args.api_key_file {
        Some(_) if args.kind != SourceKind::Stripe => {
            return Err(refusal(SourceError::ApiKeyOfStandard(args.name.clone())));
        }
        Some(path) => Some(api_key_from(path, args.mode)?),
        None => None,
    };
    let keys = args.secrets.keyring()?;
    let (name, kind, mode, stored) = (args.name.clone(), args.kind, args.mode, secret.clone());
    let added = with_conn(&args.db, move |conn| {
        at_rest::require_key_where_sealed(conn, &keys).map_err(refused_without_key)?;
        source::add_with_api_key(conn, &name, kind, mode, &stored, api_key.as_deref(), &keys)
            .map_err(refusal)
    })
    .await?;
    if !args.json {
        println!(
            "added source {} ({}, {} events); its events go to POST /inbound/{}{}",
            added.name,
            added.kind(),
            added.mode(),
            added.name,
            if added.has_api_key() {
                "; reconciled against Stripe's event log with its API key"
            } else {
                ""
            }
        );
    }
    print_secret(&added, &secret, made, args.json)
}

async fn list(args: ListArgs) -> anyhow::Result<()> {
    let sources: Vec<Source> = with_conn(&args.db, |conn| {
        source::list(conn).context("reading sources")
    })
    .await?;
    print_list(
        &sources,
        args.json,
        "no sources; add one with `outbox-relay sources add --name N --kind stripe|standard`",
        &[
            ("NAME", Align::Left),
            ("KIND", Align::Left),
            ("MODE", Align::Left),
            ("URL", Align::Left),
            ("RECONCILED", Align::Left),
            ("OLD SECRET UNTIL", Align::Left),
            ("CREATED", Align::Left),
        ],
        |s| {
            vec![
                s.name.clone(),
                s.kind().to_string(),
                s.mode().to_string(),
                format!("/inbound/{}", s.name),
                if s.has_api_key() { "yes" } else { "no" }.to_owned(),
                s.previous_secret_expires_at.map_or_else(
                    || "-".to_owned(),
                    |t| t.format("%Y-%m-%d %H:%M UTC").to_string(),
                ),
                s.created_at.format("%Y-%m-%d %H:%M UTC").to_string(),
            ]
        },
    )
}

async fn rotate(args: RotateArgs) -> anyhow::Result<()> {
    let keys = args.secrets.keyring()?;
    let (name, keep_old) = (args.name.clone(), args.keep_old);
    // Read before the database is asked anything: a bad file is a usage error.
    let given = args.secret.given()?;
    // The kind decides what a given secret must look like.
    let kind = {
        let name = name.clone();
        with_conn(&args.db, move |conn| {
            source::find(conn, &name)?
                .map(|s| s.kind())
                .ok_or_else(|| SourceError::NotFound(name).into())
        })
        .await?
    };
    let (secret, made) = secret_for(kind, given)?;
    let stored = secret.clone();
    let rotated = with_conn(&args.db, move |conn| {
        at_rest::require_key_where_sealed(conn, &keys).map_err(refused_without_key)?;
        source::rotate_secret(conn, &name, &stored, keep_old, &keys).map_err(refusal)
    })
    .await?;
    if !args.json {
        match rotated.previous_secret_expires_at {
            Some(until) => println!(
                "rotated the secret of {}; the old one also verifies until {}",
                rotated.name,
                until.format("%Y-%m-%d %H:%M:%S UTC")
            ),
            None => println!(
                "rotated the secret of {}; the old one no longer verifies",
                rotated.name
            ),
        }
    }
    print_secret(&rotated, &secret, made, args.json)
}

async fn remove(args: NameArgs) -> anyhow::Result<()> {
    let name = args.name.clone();
    with_conn(&args.db, move |conn| {
        source::remove(conn, &name).map_err(refusal)
    })
    .await?;
    println!(
        "removed source {}; POST /inbound/{} now answers 401",
        args.name, args.name
    );
    Ok(())
}

/// The API key in `path`, checked for a source of `mode`.
fn api_key_from(path: &std::path::Path, mode: SourceMode) -> anyhow::Result<String> {
    let raw = read_secret_file("--api-key-file", path)?;
    api_key::check_api_key(&raw, mode, "--api-key-file").map_err(refusal)
}

async fn set_api_key(args: SetApiKeyArgs) -> anyhow::Result<()> {
    let keys = args.secrets.keyring()?;
    // Read before the database is asked anything: a bad file is a usage error.
    let raw = read_secret_file("--api-key-file", &args.api_key_file)?;
    let name = args.name.clone();
    let source = {
        let name = name.clone();
        with_conn(&args.db, move |conn| {
            source::find(conn, &name)?.ok_or_else(|| SourceError::NotFound(name).into())
        })
        .await?
    };
    if source.kind() != SourceKind::Stripe {
        return Err(refusal(SourceError::ApiKeyOfStandard(source.name)));
    }
    let api_key = api_key::check_api_key(&raw, source.mode(), "--api-key-file").map_err(refusal)?;
    with_conn(&args.db, move |conn| {
        at_rest::require_key_where_sealed(conn, &keys).map_err(refused_without_key)?;
        api_key::set_api_key(conn, &name, &api_key, &keys).map_err(refusal)
    })
    .await?;
    println!(
        "source {} now reads Stripe's event log with the given key; `outbox-relay inbox \
         reconcile --source {}` recovers what its webhooks missed",
        args.name, args.name
    );
    Ok(())
}

fn print_secret(source: &Source, secret: &str, made: bool, json: bool) -> anyhow::Result<()> {
    super::table::print_secret(
        source.id,
        &source.name,
        secret,
        json,
        made,
        "(shown once: give it to the sender, which signs each message with it)",
    )
}
