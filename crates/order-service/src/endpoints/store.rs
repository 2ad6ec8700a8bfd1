//! The `endpoints` table: adding, listing, enabling, disabling, removing an
//! endpoint and rotating its secret. Each change is one short transaction.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel::sql_types::{BigInt, Text};
use serde::Serialize;

use super::nats::NatsTarget;
use super::spec::{EndpointName, EndpointUrl, EventTypes, RateLimit, SigningSecret};
use crate::schema::endpoints;
use crate::sealed::{
    ENDPOINT_PREVIOUS_SECRET, ENDPOINT_SECRET, Keyring, NOT_YET_SEALED, SealError, Unreadable,
};

/// The job kinds that deliver to an endpoint, whose payload names it by
/// `endpoint_id`.
pub const DELIVERY_KINDS: [&str; 2] = ["order_webhook", "order_publish"];

/// A refused or failed change to the endpoints table.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("an endpoint named {0:?} already exists")]
    DuplicateName(String),
    #[error("no endpoint is named {0:?}")]
    NotFound(String),
    #[error(
        "endpoint {name:?} has {count} unfinished deliveries (pending or failed); \
         remove it with --force to cancel them too"
    )]
    HasDeliveries { name: String, count: i64 },
    #[error(
        "endpoint {name:?} has {count} deliveries running right now; \
         wait for them to finish (or for their leases to expire) and remove it then"
    )]
    DeliveriesRunning { name: String, count: i64 },
    #[error(
        "there are already {max} endpoints, the most ENDPOINTS_MAX allows; remove one \
         (`outbox-relay endpoints remove NAME`) or raise ENDPOINTS_MAX"
    )]
    TooMany { max: u32 },
    #[error("cannot set the endpoint's delivery limits: {0}")]
    Limit(#[from] crate::outbox::ConcurrencyLimitError),
    #[error("cannot store the endpoint's secret: {0}")]
    Seal(#[from] SealError),
    #[error(transparent)]
    Unreadable(#[from] Unreadable),
    #[error(transparent)]
    Database(#[from] DieselError),
}

/// A new endpoint, every field checked.
#[derive(Debug, Clone)]
pub struct NewEndpoint {
    pub name: EndpointName,
    pub url: EndpointUrl,
    pub event_types: EventTypes,
    pub rate_limit: Option<RateLimit>,
    pub max_in_flight: i32,
    pub secret: SigningSecret,
    /// A `nats://` endpoint's stream and subject prefix.
    pub nats: Option<NatsTarget>,
}

/// One row of `endpoints`, without its secrets.
#[derive(Debug, Clone, Queryable, Selectable, Serialize)]
#[diesel(table_name = endpoints)]
pub struct Endpoint {
    pub id: i64,
    pub name: String,
    pub url: String,
    pub event_types: Option<Vec<String>>,
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    pub rate_limit: Option<f64>,
    pub max_in_flight: i32,
    pub allow_http: bool,
    pub failing_since: Option<DateTime<Utc>>,
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

impl Endpoint {
    /// `enabled`, or `disabled (operator)` / `disabled (failing)`.
    pub fn state(&self) -> String {
        match (&self.enabled, &self.disabled_reason) {
            (true, _) => "enabled".to_owned(),
            (false, Some(reason)) => format!("disabled ({reason})"),
            (false, None) => "disabled".to_owned(),
        }
    }
}

/// `ENDPOINTS_MAX` when not set. Each endpoint gets a delivery job per event
/// and a concurrency key the claim walks: without a cap, a script run wild
/// (or a stolen operator credential) multiplies every order's work.
pub const DEFAULT_MAX_ENDPOINTS: u32 = 100;

/// Adds an endpoint, with the limits of its key, if fewer than
/// [`DEFAULT_MAX_ENDPOINTS`] exist; its secret is sealed when `secrets` has
/// a key. A name already taken is refused and nothing is written.
pub fn add(
    conn: &mut PgConnection,
    new: &NewEndpoint,
    secrets: &Keyring,
) -> Result<Endpoint, StoreError> {
    add_within(conn, new, DEFAULT_MAX_ENDPOINTS, secrets)
}

/// [`add`], refusing it when `max` endpoints exist already.
pub fn add_within(
    conn: &mut PgConnection,
    new: &NewEndpoint,
    max: u32,
    secrets: &Keyring,
) -> Result<Endpoint, StoreError> {
    conn.transaction(|conn| {
        // Two adds at once must not both see room for one more.
        diesel::sql_query("SELECT pg_advisory_xact_lock(hashtext('outbox-relay endpoints add'))")
            .execute(conn)?;
        let existing: i64 = endpoints::table.count().get_result(conn)?;
        if existing >= i64::from(max) {
            return Err(StoreError::TooMany { max });
        }
        let endpoint = insert(conn, new)?;
        write_secret(conn, endpoint.id, new.secret.expose(), secrets)?;
        super::throttle::sync(conn, endpoint.id, None)?;
        Ok(endpoint)
    })
}

/// Inserts the row without its secret ([`NOT_YET_SEALED`]): the sealed one
/// names the row's id, which exists only now, and is written next in the
/// same transaction.
fn insert(conn: &mut PgConnection, new: &NewEndpoint) -> Result<Endpoint, StoreError> {
    diesel::insert_into(endpoints::table)
        .values((
            endpoints::name.eq(new.name.as_str()),
            endpoints::url.eq(new.url.as_str()),
            endpoints::event_types.eq(new.event_types.as_column()),
            endpoints::rate_limit.eq(new.rate_limit.map(RateLimit::per_second)),
            endpoints::max_in_flight.eq(new.max_in_flight),
            endpoints::secret.eq(NOT_YET_SEALED),
            endpoints::allow_http.eq(new.url.is_plaintext()),
            endpoints::stream.eq(new.nats.as_ref().map(|n| n.stream.as_str())),
            endpoints::subject_prefix.eq(new.nats.as_ref().map(|n| n.subject_prefix.as_str())),
        ))
        .returning(Endpoint::as_returning())
        .get_result(conn)
        .map_err(|error| match error {
            DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _) => {
                StoreError::DuplicateName(new.name.to_string())
            }
            other => StoreError::Database(other),
        })
}

/// Sets endpoint `id`'s signing secret, sealed for its row when `secrets`
/// has a key.
pub(crate) fn write_secret(
    conn: &mut PgConnection,
    id: i64,
    secret: &str,
    secrets: &Keyring,
) -> Result<(), StoreError> {
    let stored = secrets.seal(ENDPOINT_SECRET.at(id), secret)?;
    diesel::update(endpoints::table.find(id))
        .set(endpoints::secret.eq(stored))
        .execute(conn)?;
    Ok(())
}

/// Every endpoint, by name.
pub fn list(conn: &mut PgConnection) -> QueryResult<Vec<Endpoint>> {
    endpoints::table
        .order(endpoints::name.asc())
        .select(Endpoint::as_select())
        .load(conn)
}

/// The endpoint named `name`.
pub fn find(conn: &mut PgConnection, name: &str) -> Result<Endpoint, StoreError> {
    endpoints::table
        .filter(endpoints::name.eq(name))
        .select(Endpoint::as_select())
        .first(conn)
        .optional()?
        .ok_or_else(|| StoreError::NotFound(name.to_owned()))
}

/// Enables an endpoint (clearing why it was disabled and its failing streak),
/// releasing its waiting deliveries in order, or disables it for an
/// operator's reason, pausing them. Idempotent.
pub fn set_enabled(
    conn: &mut PgConnection,
    name: &str,
    enabled: bool,
) -> Result<Endpoint, StoreError> {
    conn.transaction(|conn| {
        let endpoint = update_enabled(conn, name, enabled)?;
        super::throttle::sync(conn, endpoint.id, None)?;
        Ok(endpoint)
    })
}

fn update_enabled(
    conn: &mut PgConnection,
    name: &str,
    enabled: bool,
) -> Result<Endpoint, StoreError> {
    let reason = (!enabled).then_some("operator");
    let target = endpoints::table.filter(endpoints::name.eq(name));
    let changed = if enabled {
        diesel::update(target)
            .set((
                endpoints::enabled.eq(true),
                endpoints::disabled_reason.eq(None::<String>),
                endpoints::failing_since.eq(None::<DateTime<Utc>>),
                endpoints::updated_at.eq(diesel::dsl::now),
            ))
            .returning(Endpoint::as_returning())
            .get_result(conn)
            .optional()?
    } else {
        diesel::update(target)
            .set((
                endpoints::enabled.eq(false),
                endpoints::disabled_reason.eq(reason),
                endpoints::updated_at.eq(diesel::dsl::now),
            ))
            .returning(Endpoint::as_returning())
            .get_result(conn)
            .optional()?
    };
    changed.ok_or_else(|| StoreError::NotFound(name.to_owned()))
}

#[derive(QueryableByName)]
struct Delivery {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    status: String,
}

/// What `remove` did: the endpoint, and the deliveries it cancelled.
#[derive(Debug, Clone, Serialize)]
pub struct Removed {
    pub endpoint: Endpoint,
    pub cancelled: Vec<i64>,
}

/// Removes an endpoint. Unfinished deliveries to it are a refusal unless
/// `force`, which cancels them in the same transaction; a delivery running
/// right now is always a refusal, since its effect may be under way.
pub fn remove(conn: &mut PgConnection, name: &str, force: bool) -> Result<Removed, StoreError> {
    conn.transaction(|conn| {
        let endpoint: Endpoint = endpoints::table
            .filter(endpoints::name.eq(name))
            .select(Endpoint::as_select())
            .for_update()
            .first(conn)
            .optional()?
            .ok_or_else(|| StoreError::NotFound(name.to_owned()))?;
        // `jobs` holds only unfinished and failed jobs; done ones are archived.
        let deliveries: Vec<Delivery> = diesel::sql_query(
            "SELECT id, status FROM jobs \
             WHERE kind = ANY($1) AND status IN ('pending', 'processing', 'failed') \
               AND payload ->> 'endpoint_id' = $2::text \
             ORDER BY id FOR UPDATE",
        )
        .bind::<diesel::sql_types::Array<Text>, _>(DELIVERY_KINDS.to_vec())
        .bind::<BigInt, _>(endpoint.id)
        .load(conn)?;
        let running = deliveries
            .iter()
            .filter(|d| d.status == "processing")
            .count();
        if running > 0 {
            return Err(StoreError::DeliveriesRunning {
                name: name.to_owned(),
                count: i64::try_from(running).unwrap_or(i64::MAX),
            });
        }
        if !deliveries.is_empty() && !force {
            return Err(StoreError::HasDeliveries {
                name: name.to_owned(),
                count: i64::try_from(deliveries.len()).unwrap_or(i64::MAX),
            });
        }
        let ids: Vec<i64> = deliveries.iter().map(|d| d.id).collect();
        let cancelled = crate::outbox::cancel_job_batch(conn, &ids)?;
        diesel::delete(endpoints::table.find(endpoint.id)).execute(conn)?;
        super::throttle::sync(conn, endpoint.id, None)?;
        Ok(Removed {
            endpoint,
            cancelled,
        })
    })
}

/// Gives an endpoint a new secret. The old one keeps signing, beside it, for
/// `keep_old` (none when zero), so receivers can switch without a failed
/// delivery; a secret older than that is dropped now. Both are sealed when
/// `secrets` has a key; keeping the old one needs the key it is sealed
/// under, dropping it does not.
pub fn rotate_secret(
    conn: &mut PgConnection,
    name: &str,
    new_secret: &SigningSecret,
    keep_old: Duration,
    secrets: &Keyring,
) -> Result<Endpoint, StoreError> {
    conn.transaction(|conn| {
        let (id, current): (i64, String) = endpoints::table
            .filter(endpoints::name.eq(name))
            .select((endpoints::id, endpoints::secret))
            .for_update()
            .first(conn)
            .optional()?
            .ok_or_else(|| StoreError::NotFound(name.to_owned()))?;
        let expires = chrono::Duration::from_std(keep_old)
            .ok()
            .filter(|keep| !keep.is_zero())
            .and_then(|keep| Utc::now().checked_add_signed(keep));
        let previous = match expires {
            Some(_) => {
                let plain = secrets
                    .open(ENDPOINT_SECRET.at(id), &current)
                    .map_err(|e| e.about(format_args!("endpoint {name:?}"), ENDPOINT_SECRET))?;
                Some(secrets.seal(ENDPOINT_PREVIOUS_SECRET.at(id), &plain)?)
            }
            None => None,
        };
        let secret = secrets.seal(ENDPOINT_SECRET.at(id), new_secret.expose())?;
        Ok(diesel::update(endpoints::table.find(id))
            .set((
                endpoints::secret.eq(secret),
                endpoints::previous_secret.eq(previous),
                endpoints::previous_secret_expires_at.eq(expires),
                endpoints::updated_at.eq(diesel::dsl::now),
            ))
            .returning(Endpoint::as_returning())
            .get_result(conn)?)
    })
}
