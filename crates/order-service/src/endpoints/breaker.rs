//! The circuit breaker of an endpoint that fails every attempt.
//!
//! A breaker exists for dead receivers, not flaky ones. An endpoint trips
//! only once every attempt to it has failed for [`Breaker::trip_after`]
//! (`ENDPOINT_TRIP_AFTER`, 30 s) with no success in between: a receiver that
//! refuses some deliveries and takes others, or is down for a few seconds,
//! is left to each delivery's own backoff, at its full limits. A tripped
//! endpoint's key is paused until the next probe and lets one delivery
//! through at a time; the wait grows with how long it has been failing (as
//! long again, up to [`Breaker::probe_max`], 5 min), so it grows only while
//! the endpoint stays dead, and a dead receiver sees a handful of calls an
//! hour, not one per queued delivery. The delivery that failed is told when
//! the next probe goes, so its `run_after` and the relay's `retry_in` say
//! when it can run. A success clears `failing_since` and restores its limits.
//! After `ENDPOINT_DISABLE_AFTER` of nothing but failures it is disabled
//! (`disabled_reason = 'failing'`): its deliveries wait, paused, until an
//! operator enables it; the endpoints subscribed to `endpoint.disabled` by
//! name are told, and the relay logs a WARN and counts it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Text, Timestamptz};

use super::attempts::Health;
use super::notice::EndpointNotice;
use super::spec::EVENT_ENDPOINT_DISABLED;
use super::throttle;
use crate::orders::{EndpointId, new_job, order_enqueuer};
use crate::outbox::{ConcurrencyLimitError, JobOptions};

/// `ENDPOINT_DISABLE_AFTER` when not set: Svix's five days.
pub const DEFAULT_DISABLE_AFTER: Duration = Duration::from_secs(5 * 24 * 3600);
/// `ENDPOINT_TRIP_AFTER` when not set.
pub const DEFAULT_TRIP_AFTER: Duration = Duration::from_secs(30);
/// `ENDPOINT_PROBE_MAX` when not set: the longest wait between two probes.
pub const DEFAULT_PROBE_MAX: Duration = Duration::from_secs(300);
/// The shortest wait between two probes (unless `probe_max` is shorter).
pub const PROBE_MIN: Duration = Duration::from_secs(1);

/// The breaker's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Breaker {
    /// Failing this long without a success disables the endpoint.
    pub disable_after: Duration,
    /// Failing this long without a success trips the breaker.
    pub trip_after: Duration,
    /// The longest wait between two probes of a tripped endpoint.
    pub probe_max: Duration,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            disable_after: DEFAULT_DISABLE_AFTER,
            trip_after: DEFAULT_TRIP_AFTER,
            probe_max: DEFAULT_PROBE_MAX,
        }
    }
}

/// What the breaker made of an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It succeeded; `recovered` if it ended a failing streak.
    Healthy { recovered: bool },
    /// It failed, but the endpoint has not failed long enough to trip: the
    /// delivery keeps its own backoff.
    Failing,
    /// It failed and the endpoint is tripped: the next probe goes at this
    /// time, and no delivery of the endpoint runs before it.
    Probing(DateTime<Utc>),
    /// It failed past `disable_after`: the endpoint is now disabled, and
    /// this many endpoints were told.
    Disabled { endpoint: String, told: usize },
}

impl Breaker {
    /// When a tripped endpoint failing since `failing_since` is probed next:
    /// after as long again as it has been failing, from [`PROBE_MIN`] up to
    /// `probe_max`.
    pub fn next_probe(&self, failing_since: DateTime<Utc>, now: DateTime<Utc>) -> DateTime<Utc> {
        let failing_for = (now - failing_since).to_std().unwrap_or_default();
        let wait = failing_for.clamp(PROBE_MIN.min(self.probe_max), self.probe_max);
        now + chrono::Duration::from_std(wait).unwrap_or_else(|_| chrono::Duration::seconds(1))
    }

    /// Whether an endpoint failing since `failing_since` is tripped at `now`.
    pub fn tripped(&self, failing_since: DateTime<Utc>, now: DateTime<Utc>) -> bool {
        (now - failing_since).to_std().unwrap_or_default() >= self.trip_after
    }
}

/// A breaker step failed.
#[derive(Debug, thiserror::Error)]
pub enum BreakerError {
    #[error(transparent)]
    Limit(#[from] ConcurrencyLimitError),
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

impl Breaker {
    /// Acts on the health an attempt left endpoint `id` in.
    pub fn after_attempt(
        &self,
        conn: &mut PgConnection,
        id: EndpointId,
        health: &Health,
        now: DateTime<Utc>,
    ) -> Result<Verdict, BreakerError> {
        let id = id.get();
        let Some(failing_since) = health.failing_since else {
            if health.changed {
                throttle::sync(conn, id, None)?;
            }
            return Ok(Verdict::Healthy {
                recovered: health.changed,
            });
        };
        let disable_at = failing_since
            + chrono::Duration::from_std(self.disable_after).unwrap_or(chrono::Duration::MAX);
        if now >= disable_at
            && let Some(verdict) = disable(conn, id, failing_since)?
        {
            return Ok(verdict);
        }
        if !self.tripped(failing_since, now) {
            // A blip, or a receiver that refuses some deliveries: each
            // delivery backs off on its own, the endpoint keeps its limits.
            return Ok(Verdict::Failing);
        }
        let probe_at = self.next_probe(failing_since, now);
        throttle::sync(conn, id, Some(probe_at))?;
        Ok(Verdict::Probing(probe_at))
    }
}

#[derive(QueryableByName)]
struct Disabled {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    failing_since: Option<DateTime<Utc>>,
}

#[derive(QueryableByName)]
struct Subscriber {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// Disables endpoint `id` for failing since `failing_since`, pauses its key
/// and tells the other endpoints, in one transaction; `None` if another relay
/// did it first or a success began a new streak (the guard re-reads the row).
fn disable(
    conn: &mut PgConnection,
    id: i64,
    failing_since: DateTime<Utc>,
) -> Result<Option<Verdict>, BreakerError> {
    conn.transaction(|conn| {
        let disabled: Option<Disabled> = diesel::sql_query(
            "UPDATE endpoints SET enabled = false, disabled_reason = 'failing', updated_at = now() \
             WHERE id = $1 AND enabled AND failing_since IS NOT NULL \
               AND failing_since <= $2 \
             RETURNING name, failing_since",
        )
        .bind::<BigInt, _>(id)
        .bind::<Timestamptz, _>(failing_since)
        .get_result(conn)
        .optional()?;
        let Some(disabled) = disabled else {
            return Ok(None);
        };
        throttle::sync(conn, id, None)?;
        // Only endpoints that named `endpoint.disabled`: one subscribed to
        // every order event is a third party (a CRM, an analytics vendor),
        // and the notice would tell it who else the shop sends orders to.
        let subscribers: Vec<Subscriber> = diesel::sql_query(
            "SELECT id FROM endpoints \
             WHERE enabled AND id <> $1 AND url !~ '^nats://' \
               AND $2 = ANY (event_types) \
             ORDER BY id",
        )
        .bind::<BigInt, _>(id)
        .bind::<Text, _>(EVENT_ENDPOINT_DISABLED)
        .load(conn)?;
        let now = Utc::now();
        let event = serde_json::json!({
            "type": EVENT_ENDPOINT_DISABLED,
            "id": format!("endpoint-{id}-disabled-{}", now.timestamp_micros()),
            "timestamp": now.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            "data": {
                "endpoint": { "id": id, "name": disabled.name },
                "reason": "failing",
                "failing_since": disabled.failing_since,
            },
        });
        let jobs = subscribers
            .iter()
            .map(|s| {
                new_job(
                    &EndpointNotice {
                        endpoint_id: EndpointId::new(s.id),
                        event: event.clone(),
                    },
                    &JobOptions::default()
                        .ordering_key(format!("endpoint:{}:notices", s.id))
                        .concurrency_key(crate::orders::endpoint_key(s.id)),
                )
            })
            .collect::<QueryResult<Vec<_>>>()?;
        order_enqueuer().enqueue_many(conn, &jobs)?;
        Ok(Some(Verdict::Disabled {
            endpoint: disabled.name,
            told: jobs.len(),
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_wait_as_long_again_as_the_endpoint_has_failed_within_bounds() {
        let now = Utc::now();
        let breaker = Breaker::default();
        let at = |secs: i64| breaker.next_probe(now - chrono::Duration::seconds(secs), now);
        assert_eq!(at(0), now + chrono::Duration::seconds(1));
        assert_eq!(at(40), now + chrono::Duration::seconds(40));
        assert_eq!(at(86_400), now + chrono::Duration::seconds(300));
        let short = Breaker {
            probe_max: Duration::from_millis(200),
            ..breaker
        };
        assert_eq!(
            short.next_probe(now - chrono::Duration::seconds(10), now),
            now + chrono::Duration::milliseconds(200)
        );
    }

    #[test]
    fn an_endpoint_trips_only_after_failing_for_trip_after() {
        let now = Utc::now();
        let breaker = Breaker::default();
        assert!(!breaker.tripped(now - chrono::Duration::seconds(29), now));
        assert!(breaker.tripped(now - chrono::Duration::seconds(30), now));
    }
}
