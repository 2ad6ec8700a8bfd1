//! What a delivery needs of its endpoint when it runs: where to send and which
//! secrets sign, read fresh for every attempt so that a rotation, a disable or
//! a new URL applies to the very next attempt.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Nullable, Text};

pub use crate::orders::DEFAULT_ENDPOINT;

/// An endpoint as a delivery sees it. Holds secrets: never printed.
#[derive(Clone, QueryableByName)]
pub struct Target {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Text)]
    pub name: String,
    #[diesel(sql_type = Text)]
    pub url: String,
    #[diesel(sql_type = Bool)]
    pub enabled: bool,
    /// The current secret(s), space-separated.
    #[diesel(sql_type = Text)]
    secret: String,
    /// The secret before the last rotation, while it still signs.
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
    /// takes them: the current first (it also keys `X-Signature`).
    pub fn signing_secrets(&self) -> String {
        match &self.previous_secret {
            Some(previous) => format!("{} {previous}", self.secret),
            None => self.secret.clone(),
        }
    }
}

/// The endpoint `endpoint_id`, or `default` for none; `None` if there is no
/// such endpoint (removed, or `default` never configured).
pub fn load(conn: &mut PgConnection, endpoint_id: Option<i64>) -> QueryResult<Option<Target>> {
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
/// `serve` and `relay` do when given those variables. Its enabled state,
/// limits and breaker are left as an operator set them.
pub fn upsert_default(
    conn: &mut PgConnection,
    url: &url::Url,
    secret: &str,
) -> Result<i64, super::StoreError> {
    conn.transaction(|conn| {
        let id = write_default(conn, url, secret)?;
        // A new `default` gets its key's limits; an existing one keeps its
        // breaker's pause, which only the breaker and operators change.
        if !super::throttle::has_limit(conn, id)? {
            super::throttle::sync(conn, id, None)?;
        }
        Ok(id)
    })
}

fn write_default(conn: &mut PgConnection, url: &url::Url, secret: &str) -> QueryResult<i64> {
    diesel::sql_query(
        "INSERT INTO endpoints (name, url, secret, allow_http) \
         VALUES ($1, $2, $3, $2 ~ '^http://') \
         ON CONFLICT (name) DO UPDATE \
           SET url = EXCLUDED.url, allow_http = EXCLUDED.allow_http, \
               secret = EXCLUDED.secret, updated_at = now() \
           WHERE (endpoints.url, endpoints.secret) \
                 IS DISTINCT FROM (EXCLUDED.url, EXCLUDED.secret) \
         RETURNING id",
    )
    .bind::<Text, _>(DEFAULT_ENDPOINT)
    .bind::<Text, _>(url.as_str())
    .bind::<Text, _>(secret)
    .execute(conn)?;
    crate::schema::endpoints::table
        .filter(crate::schema::endpoints::name.eq(DEFAULT_ENDPOINT))
        .select(crate::schema::endpoints::id)
        .first(conn)
}
