//! Senders of inbound events, as rows of `sources`: a name (the last part of
//! `POST /inbound/{name}`), how its messages are signed, and its secrets
//! (sealed when `SECRETS_KEY` is set).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use serde::Serialize;

use crate::endpoints::SigningSecret;
use crate::schema::sources;
use crate::sealed::{
    Keyring, NOT_YET_SEALED, OpenError, SOURCE_API_KEY, SOURCE_PREVIOUS_SECRET, SOURCE_SECRET,
    SealError, Unreadable,
};

/// How a source signs its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// Stripe's `Stripe-Signature: t=…,v1=…`; the secret is the key as given.
    Stripe,
    /// Standard Webhooks: `webhook-id`, `webhook-timestamp`,
    /// `webhook-signature`; a `whsec_` secret's key is its base64 tail.
    Standard,
}

impl SourceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Stripe => "stripe",
            SourceKind::Standard => "standard",
        }
    }
}

impl FromStr for SourceKind {
    type Err = String;
    fn from_str(raw: &str) -> Result<Self, String> {
        match raw {
            "stripe" => Ok(SourceKind::Stripe),
            "standard" => Ok(SourceKind::Standard),
            other => Err(format!(
                "unknown source kind {:?} (stripe or standard)",
                crate::text::one_line(other, 40)
            )),
        }
    }
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which of a Stripe account's two modes a source takes events from
/// (`sources add --mode`). Stripe marks each event with `livemode`; a test
/// event reaching a live shop (one webhook secret reused across modes, or a
/// test endpoint pointed at production) must not pay a real order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum SourceMode {
    /// Only events with `"livemode": true`.
    Live,
    /// Only events with `"livemode": false`.
    Test,
    /// Either; the default, and the only mode of a `standard` source.
    Any,
}

impl SourceMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceMode::Live => "live",
            SourceMode::Test => "test",
            SourceMode::Any => "any",
        }
    }

    /// Whether an event marked `livemode` belongs to this mode.
    pub fn takes(self, livemode: bool) -> bool {
        match self {
            SourceMode::Live => livemode,
            SourceMode::Test => !livemode,
            SourceMode::Any => true,
        }
    }
}

impl FromStr for SourceMode {
    type Err = String;
    fn from_str(raw: &str) -> Result<Self, String> {
        match raw {
            "live" => Ok(SourceMode::Live),
            "test" => Ok(SourceMode::Test),
            "any" => Ok(SourceMode::Any),
            other => Err(format!(
                "unknown source mode {:?} (live, test or any)",
                crate::text::one_line(other, 40)
            )),
        }
    }
}

impl fmt::Display for SourceMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A row of `sources`. The secrets are never serialized or printed.
#[derive(Clone, Queryable, Selectable, Serialize)]
#[diesel(table_name = sources)]
pub struct Source {
    pub id: i64,
    pub name: String,
    #[diesel(deserialize_as = String)]
    #[serde(serialize_with = "serialize_kind")]
    pub kind: KindColumn,
    #[diesel(deserialize_as = String)]
    #[serde(serialize_with = "serialize_mode")]
    pub mode: ModeColumn,
    /// As stored: sealed, or plaintext.
    #[serde(skip)]
    secret: String,
    #[serde(skip)]
    previous_secret: Option<String>,
    /// Until when the secret before the last rotation still verifies.
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    /// The provider's API key that reads its event log, as stored; shown
    /// only as whether there is one.
    #[serde(rename = "reconciled", serialize_with = "serialize_is_some")]
    api_key: Option<String>,
}

fn serialize_is_some<S: serde::Serializer>(
    value: &Option<String>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_bool(value.is_some())
}

/// The `kind` column, read as text and checked by the table's CHECK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindColumn(pub SourceKind);

impl TryFrom<String> for KindColumn {
    type Error = String;
    fn try_from(raw: String) -> Result<Self, String> {
        raw.parse().map(KindColumn)
    }
}

/// The `mode` column, read as text and checked by the table's CHECK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModeColumn(pub SourceMode);

impl TryFrom<String> for ModeColumn {
    type Error = String;
    fn try_from(raw: String) -> Result<Self, String> {
        raw.parse().map(ModeColumn)
    }
}

fn serialize_mode<S: serde::Serializer>(mode: &ModeColumn, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(mode.0.as_str())
}

fn serialize_kind<S: serde::Serializer>(kind: &KindColumn, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(kind.0.as_str())
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Source")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("kind", &self.kind.0)
            .field("mode", &self.mode.0)
            .finish_non_exhaustive()
    }
}

impl Source {
    pub fn kind(&self) -> SourceKind {
        self.kind.0
    }

    pub fn mode(&self) -> SourceMode {
        self.mode.0
    }

    /// Whether it has an API key: whether it is reconciled.
    pub fn has_api_key(&self) -> bool {
        self.api_key.is_some()
    }

    /// The API key that reads its event log, opened with `keys`; `None`
    /// when it has none.
    pub fn api_key(&self, keys: &Keyring) -> Result<Option<String>, Unreadable> {
        self.api_key
            .as_deref()
            .map(|stored| self.open(keys, SOURCE_API_KEY, stored))
            .transpose()
    }

    /// The secrets that verify a message received at `now`: the current one,
    /// and the previous one until its keep-old window ends; sealed ones are
    /// opened with `keys`.
    pub fn secrets_at(
        &self,
        keys: &Keyring,
        now: DateTime<Utc>,
    ) -> Result<Vec<String>, Unreadable> {
        let mut secrets = vec![self.open(keys, SOURCE_SECRET, &self.secret)?];
        if let (Some(previous), Some(until)) =
            (&self.previous_secret, self.previous_secret_expires_at)
            && now < until
        {
            secrets.push(self.open(keys, SOURCE_PREVIOUS_SECRET, previous)?);
        }
        Ok(secrets)
    }

    fn open(
        &self,
        keys: &Keyring,
        column: crate::sealed::Column,
        stored: &str,
    ) -> Result<String, Unreadable> {
        keys.open(column.at(self.id), stored)
            .map_err(|e: OpenError| e.about(format_args!("source {:?}", self.name), column))
    }
}

/// Why a source cannot be added, changed or found. Never carries a secret.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(
        "--name {0:?}: use 1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit"
    )]
    BadName(String),
    #[error(
        "--mode {0}: only a stripe source has modes (Standard Webhooks marks no event live or test)"
    )]
    ModeOfStandard(SourceMode),
    #[error("{flag}: {message}")]
    BadSecret { flag: &'static str, message: String },
    #[error(
        "source {0:?} is a standard source: only a stripe source has an API key (its event log is \
         Stripe's)"
    )]
    ApiKeyOfStandard(String),
    #[error("a source named {0:?} already exists")]
    NameTaken(String),
    #[error("there is no source named {0:?} (see `outbox-relay sources list`)")]
    NotFound(String),
    #[error("cannot store the source's secret: {0}")]
    Seal(#[from] SealError),
    #[error(transparent)]
    Unreadable(#[from] Unreadable),
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

/// A valid source name: it goes into URLs, metric labels and shell commands.
pub fn check_name(name: &str) -> Result<(), SourceError> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if first_ok && rest_ok && name.len() <= 64 {
        Ok(())
    } else {
        Err(SourceError::BadName(crate::text::one_line(name, 70)))
    }
}

/// A secret given with `--secret` for a source of `kind`. Stripe's is used as
/// given (its `whsec_…` string is the key itself), so any text without
/// spaces will do; a Standard Webhooks secret is `whsec_` and base64.
pub fn check_secret(
    kind: SourceKind,
    raw: &str,
    flag: &'static str,
) -> Result<String, SourceError> {
    let raw = raw.trim();
    match kind {
        SourceKind::Stripe => {
            if raw.len() < 16
                || raw.len() > 256
                || raw.chars().any(|c| c.is_whitespace() || c.is_control())
            {
                return Err(SourceError::BadSecret {
                    flag,
                    message: "a Stripe signing secret is 16 to 256 characters without spaces \
                              (copy it from the endpoint's page: whsec_…)"
                        .into(),
                });
            }
            Ok(raw.to_owned())
        }
        SourceKind::Standard => SigningSecret::parse(raw, flag)
            .map(|s| s.expose().to_owned())
            .map_err(|e| SourceError::BadSecret {
                flag,
                message: e.message,
            }),
    }
}

/// A new random `whsec_` secret.
pub fn new_secret() -> Result<String, SourceError> {
    SigningSecret::generate()
        .map(|s| s.expose().to_owned())
        .map_err(|e| SourceError::BadSecret {
            flag: "--secret",
            message: format!("no randomness to make a secret with ({e}); give one with --secret"),
        })
}

/// A source's mode, checked against its kind: `live` and `test` are Stripe's.
pub fn check_mode(kind: SourceKind, mode: SourceMode) -> Result<(), SourceError> {
    match (kind, mode) {
        (SourceKind::Standard, SourceMode::Live | SourceMode::Test) => {
            Err(SourceError::ModeOfStandard(mode))
        }
        _ => Ok(()),
    }
}

/// Adds a source taking events of `mode`, its secret sealed when `keys` has a key.
pub fn add(
    conn: &mut PgConnection,
    name: &str,
    kind: SourceKind,
    mode: SourceMode,
    secret: &str,
    keys: &Keyring,
) -> Result<Source, SourceError> {
    add_with_api_key(conn, name, kind, mode, secret, None, keys)
}

/// [`add`], with the API key that reconciles it (a `stripe` source's only),
/// sealed like its secret, in the same transaction.
pub fn add_with_api_key(
    conn: &mut PgConnection,
    name: &str,
    kind: SourceKind,
    mode: SourceMode,
    secret: &str,
    api_key: Option<&str>,
    keys: &Keyring,
) -> Result<Source, SourceError> {
    check_name(name)?;
    check_mode(kind, mode)?;
    if api_key.is_some() && kind != SourceKind::Stripe {
        return Err(SourceError::ApiKeyOfStandard(name.to_owned()));
    }
    conn.transaction(|conn| {
        // The sealed secret names the row's id: written once the row has one.
        let added: Source = diesel::insert_into(sources::table)
            .values((
                sources::name.eq(name),
                sources::kind.eq(kind.as_str()),
                sources::mode.eq(mode.as_str()),
                sources::secret.eq(NOT_YET_SEALED),
            ))
            .returning(Source::as_returning())
            .get_result(conn)
            .map_err(|e| match e {
                diesel::result::Error::DatabaseError(
                    diesel::result::DatabaseErrorKind::UniqueViolation,
                    _,
                ) => SourceError::NameTaken(name.to_owned()),
                other => SourceError::Database(other),
            })?;
        let stored = keys.seal(SOURCE_SECRET.at(added.id), secret)?;
        let api_key = api_key
            .map(|key| keys.seal(SOURCE_API_KEY.at(added.id), key))
            .transpose()?;
        Ok(diesel::update(sources::table.find(added.id))
            .set((sources::secret.eq(stored), sources::api_key.eq(api_key)))
            .returning(Source::as_returning())
            .get_result(conn)?)
    })
}

pub fn list(conn: &mut PgConnection) -> QueryResult<Vec<Source>> {
    sources::table
        .order(sources::name)
        .select(Source::as_select())
        .load(conn)
}

/// The source named `name`, if any: one probe of `sources_name_key`.
pub fn find(conn: &mut PgConnection, name: &str) -> QueryResult<Option<Source>> {
    sources::table
        .filter(sources::name.eq(name))
        .select(Source::as_select())
        .first(conn)
        .optional()
}

/// Gives source `name` a new secret. The current one keeps verifying for
/// `keep_old` (not at all when zero): the provider may still send messages
/// signed with it until it switches. Both are sealed when `keys` has a key;
/// keeping the old one needs the key it is sealed under.
pub fn rotate_secret(
    conn: &mut PgConnection,
    name: &str,
    secret: &str,
    keep_old: Duration,
    keys: &Keyring,
) -> Result<Source, SourceError> {
    conn.transaction(|conn| {
        let current: Source = sources::table
            .filter(sources::name.eq(name))
            .select(Source::as_select())
            .for_update()
            .first(conn)
            .optional()?
            .ok_or_else(|| SourceError::NotFound(name.to_owned()))?;
        let until = (!keep_old.is_zero())
            .then(|| chrono::Duration::from_std(keep_old).ok())
            .flatten()
            .and_then(|keep| Utc::now().checked_add_signed(keep));
        let previous = match until {
            Some(_) => {
                let plain = current.open(keys, SOURCE_SECRET, &current.secret)?;
                Some(keys.seal(SOURCE_PREVIOUS_SECRET.at(current.id), &plain)?)
            }
            None => None,
        };
        let stored = keys.seal(SOURCE_SECRET.at(current.id), secret)?;
        Ok(diesel::update(sources::table.find(current.id))
            .set((
                sources::secret.eq(stored),
                sources::previous_secret.eq(previous),
                sources::previous_secret_expires_at.eq(until),
            ))
            .returning(Source::as_returning())
            .get_result(conn)?)
    })
}

/// Removes source `name`: its URL answers 401 from now on. Its messages stay
/// in the inbox until their retention ends.
pub fn remove(conn: &mut PgConnection, name: &str) -> Result<(), SourceError> {
    let removed = diesel::delete(sources::table.filter(sources::name.eq(name))).execute(conn)?;
    if removed == 0 {
        return Err(SourceError::NotFound(name.to_owned()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_secrets_are_checked_without_echoing_the_secret() {
        assert!(check_name("stripe-live").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("../x").is_err());
        let short = check_secret(SourceKind::Stripe, "whsec_x", "--secret").expect_err("short");
        assert!(!short.to_string().contains("whsec_x"));
        assert!(check_secret(SourceKind::Stripe, "whsec_abcdefghijklmnop1234", "--secret").is_ok());
        assert!(check_secret(SourceKind::Standard, "not base64!", "--secret").is_err());
    }
}
