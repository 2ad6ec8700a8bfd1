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
    #[error("cannot set the endpoint's delivery limits: {0}")]
    Limit(#[from] crate::outbox::KeyLimitError),
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

/// Adds an endpoint, with the limits of its key. A name already taken is
/// refused and nothing is written.
pub fn add(conn: &mut PgConnection, new: &NewEndpoint) -> Result<Endpoint, StoreError> {
    conn.transaction(|conn| {
        let endpoint = insert(conn, new)?;
        super::throttle::sync(conn, endpoint.id, None)?;
        Ok(endpoint)
    })
}

fn insert(conn: &mut PgConnection, new: &NewEndpoint) -> Result<Endpoint, StoreError> {
    diesel::insert_into(endpoints::table)
        .values((
            endpoints::name.eq(new.name.as_str()),
            endpoints::url.eq(new.url.as_str()),
            endpoints::event_types.eq(new.event_types.as_column()),
            endpoints::rate_limit.eq(new.rate_limit.map(RateLimit::per_second)),
            endpoints::max_in_flight.eq(new.max_in_flight),
            endpoints::secret.eq(new.secret.expose()),
            endpoints::allow_http.eq(new.url.is_http()),
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
/// delivery; a secret older than that is dropped now.
pub fn rotate_secret(
    conn: &mut PgConnection,
    name: &str,
    new_secret: &SigningSecret,
    keep_old: Duration,
) -> Result<Endpoint, StoreError> {
    conn.transaction(|conn| {
        let target = endpoints::table.filter(endpoints::name.eq(name));
        let current: String = target
            .select(endpoints::secret)
            .for_update()
            .first(conn)
            .optional()?
            .ok_or_else(|| StoreError::NotFound(name.to_owned()))?;
        let expires = chrono::Duration::from_std(keep_old)
            .ok()
            .filter(|keep| !keep.is_zero())
            .and_then(|keep| Utc::now().checked_add_signed(keep));
        let previous = expires.map(|_| current);
        Ok(diesel::update(target)
            .set((
                endpoints::secret.eq(new_secret.expose()),
                endpoints::previous_secret.eq(previous),
                endpoints::previous_secret_expires_at.eq(expires),
                endpoints::updated_at.eq(diesel::dsl::now),
            ))
            .returning(Endpoint::as_returning())
            .get_result(conn)?)
    })
}
