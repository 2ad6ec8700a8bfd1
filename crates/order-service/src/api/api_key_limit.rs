//! The per-key rate limit (`API_RATE_LIMIT`): a GCRA limiter from governor,
//! keyed by API key id, in this process.
//!
//! So the limit holds per replica: N replicas behind a balancer let a key
//! through at up to N times the rate. It is there to stop one client's loop
//! from taking the database from everyone else, not to bill; a shared
//! limit would cost a database write per request. Only keys that
//! authenticated are counted, so the table holds one entry per real key.

use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;
use std::time::Duration;

use governor::clock::{Clock as _, DefaultClock};
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter as Governor};

use super::error::ApiError;

/// `API_RATE_LIMIT`'s default: a shop front placing an order a second at its
/// busiest is far below it, a runaway loop is not.
pub const DEFAULT_RATE_LIMIT: &str = "100/s";

/// Requests per period, as `API_RATE_LIMIT` says it: `50/s`, `600/m`,
/// `10000/h`. A key may also send a burst of that many at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub requests: NonZeroU32,
    pub per: Duration,
}

impl RateLimit {
    fn quota(self) -> Option<Quota> {
        let interval = self.per / self.requests.get();
        Quota::with_period(interval).map(|q| q.allow_burst(self.requests))
    }
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.per.as_secs() {
            1 => "s",
            60 => "m",
            _ => "h",
        };
        write!(f, "{}/{unit}", self.requests)
    }
}

impl FromStr for RateLimit {
    type Err = String;

    fn from_str(raw: &str) -> Result<RateLimit, String> {
        let expected = "expected requests per second, minute or hour, such as 50/s, 600/m \
                        or 10000/h, or none";
        let (count, unit) = raw
            .trim()
            .split_once('/')
            .ok_or_else(|| expected.to_owned())?;
        let requests = count
            .trim()
            .parse::<NonZeroU32>()
            .map_err(|_| format!("{count:?} is not a positive count; {expected}"))?;
        let per = match unit.trim() {
            "s" | "sec" | "second" => Duration::from_secs(1),
            "m" | "min" | "minute" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3600),
            other => return Err(format!("unknown unit {other:?}; {expected}")),
        };
        let limit = RateLimit { requests, per };
        if limit.quota().is_none() {
            return Err(format!("more than one request a nanosecond; {expected}"));
        }
        Ok(limit)
    }
}

/// `API_RATE_LIMIT`: a limit, or `None` for `none`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimitSetting(pub Option<RateLimit>);

pub fn parse_rate_limit(raw: &str) -> Result<RateLimitSetting, String> {
    match raw.trim() {
        "none" | "off" => Ok(RateLimitSetting(None)),
        other => other.parse().map(|l| RateLimitSetting(Some(l))),
    }
}

/// The limiter of one API.
pub(crate) struct RateLimiter {
    inner: Governor<i64, DefaultKeyedStateStore<i64>, DefaultClock>,
}

impl fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter").finish_non_exhaustive()
    }
}

impl RateLimiter {
    pub fn new(limit: RateLimit) -> Option<RateLimiter> {
        Some(RateLimiter {
            inner: Governor::keyed(limit.quota()?),
        })
    }

    /// Counts one request of key `id`: `429` with the whole seconds until it
    /// may send again (at least 1) when it is over its limit.
    pub fn check(&self, id: i64) -> Result<(), ApiError> {
        self.inner.check_key(&id).map_err(|not_until| {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            ApiError::RateLimited {
                retry_after_seconds: wait.as_secs() + u64::from(wait.subsec_nanos() > 0),
            }
        })?;
        // Drops the state of keys back at full capacity now and then, so a
        // process that has seen many keys does not keep them all.
        if fastrand::u16(..) == 0 {
            self.inner.retain_recent();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse_with_their_unit() {
        assert_eq!(
            parse_rate_limit("50/s").expect("valid").0,
            Some(RateLimit {
                requests: NonZeroU32::new(50).expect("valid"),
                per: Duration::from_secs(1)
            })
        );
        assert_eq!(
            parse_rate_limit("600/m")
                .expect("valid")
                .0
                .expect("valid")
                .to_string(),
            "600/m"
        );
        assert_eq!(parse_rate_limit("none").expect("valid").0, None);
        for bad in ["50", "0/s", "-1/s", "50/d", "fast", "50/"] {
            assert!(parse_rate_limit(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_key_over_its_limit_is_told_when_to_come_back_and_others_are_not() {
        let limiter = RateLimiter::new("2/m".parse().expect("valid")).expect("valid");
        assert!(limiter.check(1).is_ok());
        assert!(limiter.check(1).is_ok());
        match limiter.check(1) {
            Err(ApiError::RateLimited {
                retry_after_seconds,
            }) => assert!(
                (1..=30).contains(&retry_after_seconds),
                "{retry_after_seconds}"
            ),
            other => panic!("{other:?}"),
        }
        assert!(limiter.check(2).is_ok(), "another key has its own budget");
    }
}
