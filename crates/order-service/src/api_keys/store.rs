//! `api_keys`: create, list, revoke, and authenticate a presented key.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Binary, Nullable, Text, Timestamptz};
use serde::Serialize;
use tokio_postgres::Statement;
use tokio_postgres::types::Type;

use super::scope::Scope;
use super::secret::{NewSecret, PresentedKey};
use crate::db::PrepareOnce as _;
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
    pub expires_at: Option<DateTime<Utc>>,
}

/// How stale `last_used_at` may get before a request moves it.
const LAST_USED_GRANULARITY_SECONDS: i64 = 60;

/// The statement that looks a presented key up, and the one that notes its
/// use, with their parameters' types: the API prepares them on its own
/// connections (`api/direct.rs`); [`authenticate`] runs the same text.
pub(crate) const AUTHENTICATE_SQL: &str = include_str!("sql/authenticate.sql");
pub(crate) const AUTHENTICATE_PARAMS: &[Type] = &[Type::BYTEA];
pub(crate) const TOUCH_SQL: &str = include_str!("sql/touch_api_key.sql");
pub(crate) const TOUCH_PARAMS: &[Type] = &[Type::INT8, Type::TIMESTAMPTZ];

/// A row of [`AUTHENTICATE_SQL`].
#[derive(QueryableByName)]
struct KeyRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Array<Text>)]
    scopes: Vec<String>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    expires_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    revoked_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    last_used_at: Option<DateTime<Utc>>,
}

impl KeyRow {
    fn from_row(row: &tokio_postgres::Row) -> Result<KeyRow, tokio_postgres::Error> {
        Ok(KeyRow {
            id: row.try_get("id")?,
            scopes: row.try_get("scopes")?,
            expires_at: row.try_get("expires_at")?,
            revoked_at: row.try_get("revoked_at")?,
            last_used_at: row.try_get("last_used_at")?,
        })
    }

    /// The key as found, and whether its `last_used_at` is due to move (an
    /// active key last noted more than [`LAST_USED_GRANULARITY_SECONDS`] ago).
    fn judge(self, now: DateTime<Utc>) -> (Authenticated, bool) {
        let state = if self.revoked_at.is_some() {
            ApiKeyState::Revoked
        } else if self.expires_at.is_some_and(|at| at <= now) {
            ApiKeyState::Expired
        } else {
            ApiKeyState::Active
        };
        let stale = self
            .last_used_at
            .is_none_or(|at| (now - at).num_seconds() >= LAST_USED_GRANULARITY_SECONDS);
        let found = Authenticated {
            id: self.id,
            scopes: self.scopes,
            state,
            expires_at: self.expires_at,
        };
        (found, state == ApiKeyState::Active && stale)
    }
}

/// What [`TOUCH_SQL`] compares `last_used_at` with.
fn a_minute_before(now: DateTime<Utc>) -> DateTime<Utc> {
    now - chrono::Duration::seconds(LAST_USED_GRANULARITY_SECONDS)
}

/// Looks `key` up by its hash, and notes its use (at most once a minute).
/// `None`: no such key.
///
/// The look-up is an index probe on the hash, not a comparison of secrets:
/// its timing can tell an attacker at most how a guess's SHA-256 compares
/// with stored ones, which says nothing about any secret. It runs on every
/// request, prepared once per connection.
pub fn authenticate(
    conn: &mut PgConnection,
    key: &PresentedKey,
) -> QueryResult<Option<Authenticated>> {
    let row: Option<KeyRow> = diesel::sql_query(AUTHENTICATE_SQL)
        .bind::<Binary, _>(key.sha256().as_slice())
        .prepared()
        .get_result(conn)
        .optional()?;
    let Some(row) = row else {
        return Ok(None);
    };
    let now = Utc::now();
    let (found, touch) = row.judge(now);
    if touch {
        diesel::sql_query(TOUCH_SQL)
            .bind::<BigInt, _>(found.id)
            .bind::<Timestamptz, _>(a_minute_before(now))
            .execute(conn)?;
    }
    Ok(Some(found))
}

/// [`authenticate`] on a tokio-postgres client, with `lookup` and `touch`
/// its preparations of [`AUTHENTICATE_SQL`] and [`TOUCH_SQL`].
///
/// The touch moves `last_used_at` unless another request did so in the last
/// minute. So a key is written at most about once a minute, not on every
/// request (a write per request would add a WAL record and a commit flush to
/// each). Requests that race at the minute each try: the first writes, the
/// others wait for its row lock, re-check the condition on the row it
/// committed, and write nothing.
pub(crate) async fn authenticate_on(
    client: &tokio_postgres::Client,
    lookup: &Statement,
    touch: &Statement,
    key: &PresentedKey,
) -> Result<Option<Authenticated>, tokio_postgres::Error> {
    let hash = key.sha256();
    let Some(row) = client.query_opt(lookup, &[&hash.as_slice()]).await? else {
        return Ok(None);
    };
    let now = Utc::now();
    let (found, due) = KeyRow::from_row(&row)?.judge(now);
    if due {
        client
            .execute(touch, &[&found.id, &a_minute_before(now)])
            .await?;
    }
    Ok(Some(found))
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
