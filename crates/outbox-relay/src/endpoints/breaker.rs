//! The circuit breaker of an endpoint that fails every attempt.
//!
//! Once [`CONSECUTIVE_FAILURES_TO_TRIP`] attempts in a row have failed, and
//! while it keeps failing, its deliveries back off together: its key is paused until
//! the next probe and lets one delivery through at a time, the wait growing
//! with how long it has been failing (as long again, from 1 s up to 5 min),
//! so a dead receiver sees a handful of calls an hour, not one per queued
//! delivery. A success clears `failing_since` and restores its limits. After
//! `ENDPOINT_DISABLE_AFTER` of nothing but failures it is disabled
//! (`disabled_reason = 'failing'`): its deliveries wait, paused, until an
//! operator enables it; the endpoints subscribed to `endpoint.disabled` are
//! told, and the relay logs a WARN and counts it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Text, Timestamptz};

use super::attempts::{CONSECUTIVE_FAILURES_TO_TRIP, Health};
use super::spec::EVENT_ENDPOINT_DISABLED;
use super::throttle;
use crate::effects::EndpointNotice;
use crate::orders::{new_job, order_enqueuer};
use crate::outbox::{JobOptions, KeyLimitError};

/// `ENDPOINT_DISABLE_AFTER` when not set: Svix's five days.
pub const DEFAULT_DISABLE_AFTER: Duration = Duration::from_secs(5 * 24 * 3600);
/// The shortest and the longest wait between two probes of a failing endpoint.
pub const PROBE_WAIT: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(300));

/// The breaker's setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Breaker {
    /// Failing this long without a success disables the endpoint.
    pub disable_after: Duration,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            disable_after: DEFAULT_DISABLE_AFTER,
        }
    }
}

/// What the breaker made of an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It succeeded; `recovered` if it ended a failing streak.
    Healthy { recovered: bool },
    /// It failed, but too few attempts in a row have failed to trip the
    /// breaker.
    Failing,
    /// It failed: the next probe goes at this time.
    Probing(DateTime<Utc>),
    /// It failed past `disable_after`: the endpoint is now disabled, and
    /// this many endpoints were told.
    Disabled { endpoint: String, told: usize },
}

/// When a failing endpoint is probed next: after as long again as it has
/// been failing, within [`PROBE_WAIT`].
pub fn next_probe(failing_since: DateTime<Utc>, now: DateTime<Utc>) -> DateTime<Utc> {
    let failing_for = (now - failing_since).to_std().unwrap_or_default();
    let wait = failing_for.clamp(PROBE_WAIT.0, PROBE_WAIT.1);
    now + chrono::Duration::from_std(wait).unwrap_or_else(|_| chrono::Duration::seconds(1))
}

/// A breaker step failed.
#[derive(Debug, thiserror::Error)]
pub enum BreakerError {
    #[error(transparent)]
    Limit(#[from] KeyLimitError),
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

impl Breaker {
    /// Acts on the health an attempt left endpoint `id` in.
    pub fn after_attempt(
        &self,
        conn: &mut PgConnection,
        id: i64,
        health: &Health,
        now: DateTime<Utc>,
    ) -> Result<Verdict, BreakerError> {
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
        if health.failures_before + 1 < CONSECUTIVE_FAILURES_TO_TRIP {
            // A blip: each delivery backs off on its own, the endpoint keeps
            // its limits.
            return Ok(Verdict::Failing);
        }
        let probe_at = next_probe(failing_since, now);
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
        let subscribers: Vec<Subscriber> = diesel::sql_query(
            "SELECT id FROM endpoints \
             WHERE enabled AND id <> $1 AND url !~ '^nats://' \
               AND (event_types IS NULL OR $2 = ANY (event_types)) \
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
                        endpoint_id: s.id,
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
        let at = |secs: i64| next_probe(now - chrono::Duration::seconds(secs), now);
        assert_eq!(at(0), now + chrono::Duration::seconds(1));
        assert_eq!(at(10), now + chrono::Duration::seconds(10));
        assert_eq!(at(86_400), now + chrono::Duration::seconds(300));
    }
}
