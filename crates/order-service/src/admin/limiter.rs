//! The limit on failed logins, per client address.
//!
//! One global limit let anyone lock every operator out with a few bad
//! guesses. Counting per client (its address as `client_addr` reads it,
//! behind `TRUSTED_PROXIES`) keeps a guesser to a few tries a minute while
//! everyone else logs in as usual.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::client_addr::client_key;

/// Failed logins one client may make within `FAILURE_WINDOW`; past it, that
/// client's logins are answered 429 until its oldest failure ages out.
pub(super) const MAX_FAILURES: usize = 10;
pub(super) const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Clients remembered at most, so a flood from many addresses cannot grow
/// the table without bound. Past it, clients whose failures aged out go
/// first, then the one whose last failure is oldest.
const MAX_CLIENTS: usize = 10_000;

/// Failed logins in the last `FAILURE_WINDOW`, per client.
#[derive(Debug, Default)]
pub(super) struct LoginLimiter {
    failures: Mutex<HashMap<IpAddr, VecDeque<Instant>>>,
}

impl LoginLimiter {
    /// `Some(wait)` when `client`'s logins are refused for now.
    pub fn blocked_for(&self, client: IpAddr) -> Option<Duration> {
        self.blocked_for_at(client, Instant::now())
    }

    pub fn record_failure(&self, client: IpAddr) {
        self.record_failure_at(client, Instant::now());
    }

    fn blocked_for_at(&self, client: IpAddr, now: Instant) -> Option<Duration> {
        let mut clients = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let failures = clients.get_mut(&client_key(client))?;
        forget_old(failures, now);
        if failures.len() < MAX_FAILURES {
            return None;
        }
        let oldest = failures.front().copied().unwrap_or(now);
        Some(FAILURE_WINDOW.saturating_sub(now.duration_since(oldest)))
    }

    fn record_failure_at(&self, client: IpAddr, now: Instant) {
        let mut clients = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let key = client_key(client);
        if !clients.contains_key(&key) && clients.len() >= MAX_CLIENTS {
            make_room(&mut clients, now);
        }
        let failures = clients.entry(key).or_default();
        failures.push_back(now);
        while failures.len() > MAX_FAILURES {
            failures.pop_front();
        }
    }
}

fn forget_old(failures: &mut VecDeque<Instant>, now: Instant) {
    while failures
        .front()
        .is_some_and(|t| now.duration_since(*t) >= FAILURE_WINDOW)
    {
        failures.pop_front();
    }
}

fn make_room(clients: &mut HashMap<IpAddr, VecDeque<Instant>>, now: Instant) {
    clients.retain(|_, failures| {
        forget_old(failures, now);
        !failures.is_empty()
    });
    if clients.len() >= MAX_CLIENTS {
        let stalest = clients
            .iter()
            .min_by_key(|(_, failures)| failures.back().copied())
            .map(|(ip, _)| *ip);
        if let Some(ip) = stalest {
            clients.remove(&ip);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("IP")
    }

    #[test]
    fn one_client_is_blocked_and_another_is_not() {
        let limiter = LoginLimiter::default();
        let now = Instant::now();
        for _ in 0..MAX_FAILURES {
            assert!(limiter.blocked_for_at(ip("198.51.100.7"), now).is_none());
            limiter.record_failure_at(ip("198.51.100.7"), now);
        }
        assert!(limiter.blocked_for_at(ip("198.51.100.7"), now).is_some());
        assert!(limiter.blocked_for_at(ip("203.0.113.9"), now).is_none());
        // Until its failures age out.
        let later = now + FAILURE_WINDOW;
        assert!(limiter.blocked_for_at(ip("198.51.100.7"), later).is_none());
    }

    #[test]
    fn an_ipv6_client_cannot_dodge_the_limit_within_its_64() {
        let limiter = LoginLimiter::default();
        let now = Instant::now();
        for i in 0..MAX_FAILURES {
            limiter.record_failure_at(ip(&format!("2001:db8::{i:x}")), now);
        }
        assert!(limiter.blocked_for_at(ip("2001:db8::ffff"), now).is_some());
        assert!(limiter.blocked_for_at(ip("2001:db8:0:1::1"), now).is_none());
    }

    #[test]
    fn the_table_stays_bounded() {
        let limiter = LoginLimiter::default();
        let now = Instant::now();
        for i in 0..(MAX_CLIENTS as u32 + 50) {
            limiter.record_failure_at(IpAddr::from(i.to_be_bytes()), now);
        }
        let size = limiter.failures.lock().expect("lock").len();
        assert!(size <= MAX_CLIENTS, "{size}");
    }
}
