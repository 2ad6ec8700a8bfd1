//! What a delivery needs of its endpoint when it runs: where to send and which
//! secrets sign, read fresh for every attempt so that a rotation, a disable or
//! a new URL applies to the very next attempt.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Nullable, Text};

pub use crate::orders::DEFAULT_ENDPOINT;
use crate::orders::EndpointId;
use crate::sealed::{
    Column, ENDPOINT_PREVIOUS_SECRET, ENDPOINT_SECRET, Keyring, NOT_YET_SEALED, OpenError, Stored,
    Unreadable,
};

/// An endpoint as a delivery sees it. Holds secrets: never printed.
#[derive(Clone, QueryableByName)]
pub struct Target {
    #[diesel(sql_type = BigInt)]
    pub id: EndpointId,
    #[diesel(sql_type = Text)]
    pub name: String,
    #[diesel(sql_type = Text)]
    pub url: String,
    #[diesel(sql_type = Bool)]
    pub enabled: bool,
    /// The current secret(s), space-separated, as stored (sealed or not).
    #[diesel(sql_type = Text)]
    secret: String,
    /// The secret before the last rotation, while it still signs, as stored.
    #[diesel(sql_type = Nullable<Text>)]
    previous_secret: Option<String>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("enabled", &self.enabled)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// Every secret that signs now, space-separated as `Secrets::parse`
    /// takes them: the current first (it also keys `X-Signature`). Sealed
    /// ones are opened with `secrets`.
    pub fn signing_secrets(&self, secrets: &Keyring) -> Result<String, Unreadable> {
        let unreadable = |e: OpenError, column: Column| {
            e.about(format_args!("endpoint {:?}", self.name), column)
        };
        let current = secrets
            .open(ENDPOINT_SECRET.at(self.id.get()), &self.secret)
            .map_err(|e| unreadable(e, ENDPOINT_SECRET))?;
        Ok(match &self.previous_secret {
            Some(previous) => {
                let previous = secrets
                    .open(ENDPOINT_PREVIOUS_SECRET.at(self.id.get()), previous)
                    .map_err(|e| unreadable(e, ENDPOINT_PREVIOUS_SECRET))?;
                format!("{current} {previous}")
            }
            None => current,
        })
    }
}

/// The endpoint `endpoint_id`, or `default` for none; `None` if there is no
/// such endpoint (removed, or `default` never configured).
pub fn load(
    conn: &mut PgConnection,
    endpoint_id: Option<EndpointId>,
) -> QueryResult<Option<Target>> {
    diesel::sql_query(
        "SELECT id, name, url, enabled, secret, \
                CASE WHEN previous_secret_expires_at > now() THEN previous_secret END \
                  AS previous_secret \
         FROM endpoints \
         WHERE CASE WHEN $1::bigint IS NULL THEN name = $2 ELSE id = $1 END",
    )
    .bind::<Nullable<BigInt>, _>(endpoint_id)
    .bind::<Text, _>(DEFAULT_ENDPOINT)
    .get_result(conn)
    .optional()
}

/// Creates the endpoint `default` from `WEBHOOK_URL` / `WEBHOOK_SECRET`
/// (subscribed to every event), or points it at them again: what `migrate`,
/// `serve` and `relay` do when given those variables. Its secret is sealed
/// when `secrets` has a key. Its enabled state, limits and breaker are left
/// as an operator set them.
pub fn upsert_default(
    conn: &mut PgConnection,
    url: &url::Url,
    secret: &str,
    secrets: &Keyring,
) -> Result<i64, super::StoreError> {
    conn.transaction(|conn| {
        let id = write_default(conn, url, secret, secrets)?;
        // A new `default` gets its key's limits; an existing one keeps its
        // breaker's pause, which only the breaker and operators change.
        if !super::throttle::has_limit(conn, id)? {
            super::throttle::sync(conn, id, None)?;
        }
        Ok(id)
    })
}

#[derive(QueryableByName)]
struct DefaultRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    url: String,
    #[diesel(sql_type = Text)]
    secret: String,
}

/// Inserts `default` if it is missing (without its secret: the sealed one
/// names the row's id), then rewrites its URL and secret only when they
/// differ from the configured ones, or its secret is not sealed under the
/// current key: every process that starts with WEBHOOK_URL runs this, and
/// most find nothing to change.
fn write_default(
    conn: &mut PgConnection,
    url: &url::Url,
    secret: &str,
    secrets: &Keyring,
) -> Result<i64, super::StoreError> {
    if !secrets.seals() {
        refuse_plaintext_where_sealed(conn, url, secret)?;
    }
    diesel::sql_query(
        "INSERT INTO endpoints (name, url, secret, allow_http) \
         VALUES ($1, $2, $3, $2 ~ '^http://') \
         ON CONFLICT (name) DO NOTHING",
    )
    .bind::<Text, _>(DEFAULT_ENDPOINT)
    .bind::<Text, _>(url.as_str())
    .bind::<Text, _>(NOT_YET_SEALED)
    .execute(conn)?;
    let row: DefaultRow =
        diesel::sql_query("SELECT id, url, secret FROM endpoints WHERE name = $1 FOR UPDATE")
            .bind::<Text, _>(DEFAULT_ENDPOINT)
            .get_result(conn)?;
    // A stored secret that cannot be opened (sealed under a key this
    // process lacks) is replaced: WEBHOOK_SECRET says what it is.
    let same_secret = secrets
        .open(ENDPOINT_SECRET.at(row.id), &row.secret)
        .is_ok_and(|stored| stored == secret);
    let sealed_as_wanted = !secrets.seals() || secrets.state_of(&row.secret) == Stored::Current;
    if row.url != url.as_str() || !same_secret || !sealed_as_wanted {
        let stored = secrets.seal(ENDPOINT_SECRET.at(row.id), secret)?;
        diesel::sql_query(
            "UPDATE endpoints SET url = $2, allow_http = $2 ~ '^http://', secret = $3, \
                    updated_at = now() \
             WHERE id = $1",
        )
        .bind::<BigInt, _>(row.id)
        .bind::<Text, _>(url.as_str())
        .bind::<Text, _>(stored)
        .execute(conn)?;
    }
    Ok(row.id)
}

/// Without a key, `default` would be written in plaintext: refused (before
/// anything is written) where the database holds sealed secrets, as the
/// `endpoints` and `sources` commands refuse, unless `default` is already
/// as configured and nothing would be written. A process started with
/// `WEBHOOK_URL` but without `SECRETS_KEY` would otherwise unseal
/// `default`'s secret, or store a new one in the clear beside sealed ones.
fn refuse_plaintext_where_sealed(
    conn: &mut PgConnection,
    url: &url::Url,
    secret: &str,
) -> Result<(), super::StoreError> {
    let stored: Option<DefaultRow> =
        diesel::sql_query("SELECT id, url, secret FROM endpoints WHERE name = $1 FOR UPDATE")
            .bind::<Text, _>(DEFAULT_ENDPOINT)
            .get_result(conn)
            .optional()?;
    if stored.is_some_and(|row| row.url == url.as_str() && row.secret == secret) {
        return Ok(());
    }
    crate::at_rest::require_key_where_sealed(conn, &Keyring::none()).map_err(|e| match e {
        crate::at_rest::SealedWithoutKey::Database(e) => super::StoreError::Database(e),
        crate::at_rest::SealedWithoutKey::Sealed(ids) => super::StoreError::SealedWithoutKey(ids),
    })
}
