//! Where an endpoint is throttled: its concurrency key (`endpoint:<id>`) and its [`ConcurrencyLimit`],
//! kept in step with the endpoint's row: its `max_in_flight` and `rate_limit`
//! while healthy, one probe at a time while failing, paused while disabled.
//! Every change to those columns calls [`sync`] in its own transaction, so
//! the limit and the row never disagree once it commits.

use chrono::{DateTime, Utc};
use diesel::prelude::*;

use crate::orders::endpoint_key;
use crate::outbox::{
    ConcurrencyLimit, ConcurrencyLimitError, concurrency_state, remove_concurrency_limit,
    set_concurrency_limit,
};
use crate::schema::endpoints;

/// What the limit of an endpoint's key depends on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThrottleInput {
    pub enabled: bool,
    pub max_in_flight: i32,
    pub rate_limit: Option<f64>,
    /// While failing: the breaker's next probe, and one call at a time.
    pub probe_at: Option<DateTime<Utc>>,
}

/// The limit an endpoint in `state` calls for.
pub fn limit_for(state: &ThrottleInput) -> ConcurrencyLimit {
    if !state.enabled {
        // Its deliveries wait, pending, until it is enabled again.
        return ConcurrencyLimit {
            max_in_flight: Some(state.max_in_flight),
            per_second: state.rate_limit,
            paused_until: Some(DateTime::<Utc>::MAX_UTC),
        };
    }
    match state.probe_at {
        Some(at) => ConcurrencyLimit {
            max_in_flight: Some(1),
            per_second: state.rate_limit,
            paused_until: Some(at),
        },
        None => ConcurrencyLimit {
            max_in_flight: Some(state.max_in_flight),
            per_second: state.rate_limit,
            paused_until: None,
        },
    }
}

/// Whether endpoint `id`'s key has limits set.
pub fn has_limit(conn: &mut PgConnection, id: i64) -> QueryResult<bool> {
    Ok(concurrency_state(conn, &endpoint_key(id))?
        .is_some_and(|s| s.limit != ConcurrencyLimit::default()))
}

/// Sets the limit of endpoint `id`'s key from its row (`probe_at`: the
/// breaker's, if it is failing); lifts it when the endpoint is gone.
pub fn sync(
    conn: &mut PgConnection,
    id: i64,
    probe_at: Option<DateTime<Utc>>,
) -> Result<(), ConcurrencyLimitError> {
    let row: Option<(bool, i32, Option<f64>)> = endpoints::table
        .find(id)
        .select((
            endpoints::enabled,
            endpoints::max_in_flight,
            endpoints::rate_limit,
        ))
        .first(conn)
        .optional()?;
    let key = endpoint_key(id);
    match row {
        None => Ok(remove_concurrency_limit(conn, &key)?),
        Some((enabled, max_in_flight, rate_limit)) => set_concurrency_limit(
            conn,
            &key,
            &limit_for(&ThrottleInput {
                enabled,
                max_in_flight,
                rate_limit,
                probe_at,
            }),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disabled_endpoint_is_paused_a_failing_one_probes_a_healthy_one_has_its_limits() {
        let healthy = ThrottleInput {
            enabled: true,
            max_in_flight: 8,
            rate_limit: Some(5.0),
            probe_at: None,
        };
        assert_eq!(
            limit_for(&healthy),
            ConcurrencyLimit {
                max_in_flight: Some(8),
                per_second: Some(5.0),
                paused_until: None
            }
        );
        let at = Utc::now();
        let failing = limit_for(&ThrottleInput {
            probe_at: Some(at),
            ..healthy
        });
        assert_eq!(failing.max_in_flight, Some(1));
        assert_eq!(failing.paused_until, Some(at));
        let disabled = limit_for(&ThrottleInput {
            enabled: false,
            probe_at: Some(at),
            ..healthy
        });
        assert_eq!(disabled.paused_until, Some(DateTime::<Utc>::MAX_UTC));
    }
}
