//! `api_keys`: create, list, revoke, and authenticate a presented key.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use serde::Serialize;

use super::scope::Scope;
use super::secret::{NewSecret, PresentedKey};
use crate::schema::api_keys;

/// A key's name: what `keys revoke` and `keys list` call it. Letters,
/// digits, `.`, `_` and `-`, 1 to 64 of them, starting with a letter or digit
/// (the database's `api_keys_name_valid` says the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyName(String);

impl KeyName {
    pub const MAX_LEN: usize = 64;

    pub fn parse(raw: &str) -> Result<KeyName, String> {
        let valid_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        match raw.chars().next() {
            None => Err("must not be empty".into()),
            _ if raw.len() > Self::MAX_LEN => {
                Err(format!("must be at most {} characters", Self::MAX_LEN))
            }
            Some(first) if !first.is_ascii_alphanumeric() => {
                Err("must start with a letter or a digit".into())
            }
            _ if !raw.chars().all(valid_char) => {
                Err("may hold only letters, digits, '.', '_' and '-'".into())
            }
            _ => Ok(KeyName(raw.to_owned())),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A key as `keys list` shows it: everything but its hash.
#[derive(Debug, Clone, Queryable, Selectable, Serialize)]
#[diesel(table_name = api_keys)]
pub struct ApiKey {
    pub id: i64,
    pub name: String,
    pub scopes: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// A key just created, with its secret: the only time the secret exists
/// outside the client.
#[derive(Debug, Clone)]
pub struct CreatedKey {
    pub id: i64,
    pub name: String,
    pub secret: NewSecret,
    pub scopes: Vec<Scope>,
    pub expires_at: Option<DateTime<Utc>>,
}

#[derive(Debug, thiserror::Error)]
pub enum CreateKeyError {
    #[error("a key named {0:?} already exists; revoke it or choose another name")]
    DuplicateName(String),
    #[error(transparent)]
    Random(anyhow::Error),
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

/// Creates a key with `scopes`, expiring at `expires_at` (never, if `None`).
pub fn create_key(
    conn: &mut PgConnection,
    name: &KeyName,
    scopes: &[Scope],
    expires_at: Option<DateTime<Utc>>,
) -> Result<CreatedKey, CreateKeyError> {
    let secret = NewSecret::generate().map_err(CreateKeyError::Random)?;
    let stored: Vec<&str> = scopes.iter().map(|s| s.as_str()).collect();
    let id: Option<i64> = diesel::insert_into(api_keys::table)
        .values((
            api_keys::name.eq(name.as_str()),
            api_keys::scopes.eq(&stored),
            api_keys::secret_sha256.eq(secret.sha256().as_slice()),
            api_keys::expires_at.eq(expires_at),
        ))
        .on_conflict(api_keys::name)
        .do_nothing()
        .returning(api_keys::id)
        .get_result(conn)
        .optional()?;
    let id = id.ok_or_else(|| CreateKeyError::DuplicateName(name.as_str().to_owned()))?;
    Ok(CreatedKey {
        id,
        name: name.as_str().to_owned(),
        secret,
        scopes: scopes.to_vec(),
        expires_at,
    })
}

/// Every key, oldest first, revoked ones included.
pub fn list_keys(conn: &mut PgConnection) -> QueryResult<Vec<ApiKey>> {
    api_keys::table
        .order(api_keys::id)
        .select(ApiKey::as_select())
        .load(conn)
}

/// What `revoke_key` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revoked {
    Now(DateTime<Utc>),
    /// It was revoked before, at that time; nothing changed.
    Already(DateTime<Utc>),
}

#[derive(Debug, thiserror::Error)]
pub enum RevokeError {
    #[error("there is no key named {0:?} (see `outbox-relay keys list`)")]
    NotFound(String),
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

/// Revokes the key named `name`. Every replica sees it on its next request:
/// the API reads `api_keys` on each one and caches nothing.
pub fn revoke_key(conn: &mut PgConnection, name: &str) -> Result<Revoked, RevokeError> {
    let now: Option<DateTime<Utc>> = diesel::update(
        api_keys::table
            .filter(api_keys::name.eq(name))
            .filter(api_keys::revoked_at.is_null()),
    )
    .set(api_keys::revoked_at.eq(diesel::dsl::now))
    .returning(api_keys::revoked_at.assume_not_null())
    .get_result(conn)
    .optional()?;
    if let Some(at) = now {
        return Ok(Revoked::Now(at));
    }
    let earlier: Option<Option<DateTime<Utc>>> = api_keys::table
        .filter(api_keys::name.eq(name))
        .select(api_keys::revoked_at)
        .first(conn)
        .optional()?;
    match earlier {
        Some(Some(at)) => Ok(Revoked::Already(at)),
        // Unrevoked a moment ago and gone now: only a concurrent delete,
        // which nothing does; say what is true now.
        Some(None) | None => Err(RevokeError::NotFound(name.to_owned())),
    }
}

/// Whether a stored key may be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiKeyState {
    Active,
    Expired,
    Revoked,
}

/// A presented key found in `api_keys`.
#[derive(Debug, Clone)]
pub struct Authenticated {
    pub id: i64,
    pub scopes: Vec<String>,
    pub state: ApiKeyState,
}

/// How stale `last_used_at` may get before a request moves it.
const LAST_USED_GRANULARITY_SECONDS: i64 = 60;

/// Looks `key` up by its hash, and notes its use (at most once a minute).
/// `None`: no such key.
///
/// The look-up is an index probe on the hash, not a comparison of secrets:
/// its timing can tell an attacker at most how a guess's SHA-256 compares
/// with stored ones, which says nothing about any secret. It is Diesel's
/// DSL, so a prepared statement per connection: it runs on every request.
pub fn authenticate(
    conn: &mut PgConnection,
    key: &PresentedKey,
) -> QueryResult<Option<Authenticated>> {
    type Row = (
        i64,
        Vec<String>,
        Option<DateTime<Utc>>,
        Option<DateTime<Utc>>,
        Option<DateTime<Utc>>,
    );
    let row: Option<Row> = api_keys::table
        .filter(api_keys::secret_sha256.eq(key.sha256().as_slice()))
        .select((
            api_keys::id,
            api_keys::scopes,
            api_keys::expires_at,
            api_keys::revoked_at,
            api_keys::last_used_at,
        ))
        .first(conn)
        .optional()?;
    let Some((id, scopes, expires_at, revoked_at, last_used_at)) = row else {
        return Ok(None);
    };
    let now = Utc::now();
    let state = if revoked_at.is_some() {
        ApiKeyState::Revoked
    } else if expires_at.is_some_and(|at| at <= now) {
        ApiKeyState::Expired
    } else {
        ApiKeyState::Active
    };
    let stale =
        last_used_at.is_none_or(|at| (now - at).num_seconds() >= LAST_USED_GRANULARITY_SECONDS);
    if state == ApiKeyState::Active && stale {
        touch(conn, id)?;
    }
    Ok(Some(Authenticated { id, scopes, state }))
}

/// Moves the key's `last_used_at` to now, unless another request did so in
/// the last minute. So a key is written at most about once a minute, not on
/// every request (a write per request would add a WAL record and a commit
/// flush to each). Requests that race at the minute each try: the first
/// writes, the others wait for its row lock, re-check the condition on the
/// row it committed, and write nothing.
fn touch(conn: &mut PgConnection, id: i64) -> QueryResult<usize> {
    let a_minute_ago = Utc::now() - chrono::Duration::seconds(LAST_USED_GRANULARITY_SECONDS);
    diesel::update(
        api_keys::table.find(id).filter(
            api_keys::last_used_at
                .is_null()
                .or(api_keys::last_used_at.lt(a_minute_ago)),
        ),
    )
    .set(api_keys::last_used_at.eq(diesel::dsl::now))
    .execute(conn)
}

#[cfg(test)]
mod tests {
    use super::KeyName;

    #[test]
    fn key_names_are_checked() {
        assert!(KeyName::parse("shop-front.eu_1").is_ok());
        assert!(KeyName::parse("").is_err());
        assert!(KeyName::parse("-shop").is_err());
        assert!(KeyName::parse("shop front").is_err());
        assert!(KeyName::parse(&"a".repeat(65)).is_err());
    }
}
