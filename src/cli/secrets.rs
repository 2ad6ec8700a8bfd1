//! `outbox-relay secrets seal`: every stored secret of the endpoints and
//! sources sealed under `SECRETS_KEY`, after the key is first set or
//! rotated. It runs beside live relays and APIs: one short transaction per
//! row, and a second run finds nothing left to do.

use clap::{Args, Subcommand};

use crate::at_rest::{self, SealAllError};
use crate::cli::with_conn;
use crate::config::{ConfigError, DatabaseArgs, SecretsKeyArgs};
use crate::sealed::Keyring;

#[derive(Debug, Subcommand)]
pub enum SecretsCommand {
    /// Seal every plaintext secret under SECRETS_KEY, and move the ones
    /// under SECRETS_KEY_PREVIOUS to it; prints what it did.
    #[command(after_help = "Examples:\n  \
        SECRETS_KEY=$(cat /run/secrets/outbox-key) outbox-relay secrets seal\n  \
        SECRETS_KEY=... SECRETS_KEY_PREVIOUS=... outbox-relay secrets seal   # after a rotation")]
    Seal(SealArgs),
}

#[derive(Debug, Args)]
pub struct SealArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    #[command(flatten)]
    secrets: SecretsKeyArgs,
    /// Print {"sealed","resealed","unchanged","unreadable"} as JSON.
    #[arg(long)]
    json: bool,
}

/// A plaintext write where secrets are sealed is a usage error (exit 2):
/// the command's environment lacks SECRETS_KEY (`endpoints` and `sources`
/// commands that write a secret).
pub(super) fn refused_without_key(error: at_rest::SealedWithoutKey) -> anyhow::Error {
    match error {
        at_rest::SealedWithoutKey::Database(e) => anyhow::Error::from(e),
        refused => ConfigError(refused.to_string()).into(),
    }
}

/// What `serve` and `relay` check of the stored secrets once the database
/// is migrated: warnings, or with `SECRETS_PLAINTEXT=refuse` a plaintext
/// secret that stops the start (exit 2). Without that setting a census that
/// cannot be taken is only a warning.
pub(super) async fn check_stored_at_start(
    database_url: &str,
    keys: &Keyring,
) -> anyhow::Result<()> {
    let refuses = keys.refuses_plaintext();
    let (url, keys) = (database_url.to_owned(), keys.clone());
    let checked = tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut conn = crate::db::establish(&url)?;
        at_rest::check_at_start(&mut conn, &keys).map_err(|e| match e {
            at_rest::PlaintextStored::Found(_) => ConfigError(e.to_string()).into(),
            other => anyhow::Error::from(other),
        })
    })
    .await?;
    match checked {
        Err(error) if !refuses => {
            tracing::warn!(
                error = format!("{error:#}"),
                "cannot count the stored secrets"
            );
            Ok(())
        }
        checked => checked,
    }
}

pub async fn run(command: SecretsCommand) -> anyhow::Result<()> {
    match command {
        SecretsCommand::Seal(args) => seal(args).await,
    }
}

async fn seal(args: SealArgs) -> anyhow::Result<()> {
    let keys = args.secrets.keyring()?;
    let Some(key_id) = keys.current_id().map(str::to_owned) else {
        return Err(ConfigError(
            "SECRETS_KEY is not set: there is no key to seal with (32 random bytes, \
             e.g. `openssl rand -base64 32`)"
                .to_owned(),
        )
        .into());
    };
    let report = with_conn(&args.db, move |conn| {
        at_rest::seal_all(conn, &keys).map_err(|e| match e {
            SealAllError::NoKey => anyhow::Error::from(ConfigError(e.to_string())),
            other => other.into(),
        })
    })
    .await?;
    for unreadable in &report.unreadable {
        eprintln!("left as it is: {unreadable}");
    }
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "key_id": key_id,
                "sealed": report.sealed,
                "resealed": report.resealed,
                "unchanged": report.unchanged,
                "unreadable": report.unreadable.len(),
            })
        );
    } else {
        println!(
            "sealed {} plaintext secrets and moved {} from SECRETS_KEY_PREVIOUS to \
             SECRETS_KEY (key {key_id}); {} were sealed under it already",
            report.sealed, report.resealed, report.unchanged
        );
    }
    match report.unreadable.len() {
        0 => Ok(()),
        n => Err(anyhow::anyhow!(
            "{n} stored secrets cannot be opened with SECRETS_KEY or SECRETS_KEY_PREVIOUS and \
             were left as they are (listed above)"
        )),
    }
}
