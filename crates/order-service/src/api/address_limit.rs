//! The limit before authentication: what one client address may cost the
//! API without a valid key (`API_ADDRESS_LIMIT`).
//!
//! Every answer says how its request got in ([`Admitted`]). A request that
//! was not admitted by a key and failed (any 4xx: a made-up or revoked key,
//! no key, a bad link, an unknown route), or that got in without a key (a
//! signed receipt link), spends one unit of its address's budget. Once the
//! budget is spent, that address's requests are refused with 429 before
//! anything else runs: no key look-up, no body read. Requests admitted by a
//! key never spend it; the per-key limit ([`RateLimit`]) counts those.
//!
//! The address is the client's as [`TrustedProxies`] forward it, counted by
//! [`client_key`] (an IPv6 client by its /64). Loopback is never limited: a
//! local proxy, a sidecar, a benchmark. The limit counts in this process, as
//! the per-key one does.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};

use super::api_key_limit::RateLimit;
use super::error::ApiError;
use crate::client_addr::{TrustedProxies, client_key};

/// `API_ADDRESS_LIMIT`'s default: failed or unauthenticated requests per
/// address. A customer opening a few receipt links, or a client with a
/// mistyped key retrying with backoff, stays far below it; a key guesser or
/// a flood of made-up keys does not.
pub const DEFAULT_ADDRESS_LIMIT: &str = "60/m";

/// Addresses tracked at most. Past it, a new address is let through
/// uncounted until the table is swept, rather than grow without bound.
const MAX_TRACKED: usize = 100_000;

/// How a request got in, in its response's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admitted {
    /// A valid key (including one refused 403 or 429 after it was found).
    Key,
    /// Without a key, on purpose: a signed receipt link.
    Anonymous,
    /// `API_AUTH=none`: nothing to count.
    Open,
}

/// The budget of each address: a GCRA (the state of one address is the time
/// at which its budget is full again, plus the burst).
pub(crate) struct AddressLimiter {
    /// Time one unit takes to come back.
    interval: Duration,
    /// The burst: `interval × requests`.
    window: Duration,
    /// Per address: when its spent units are all back.
    full_at: Mutex<HashMap<IpAddr, Instant>>,
}

impl fmt::Debug for AddressLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AddressLimiter")
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

impl AddressLimiter {
    pub fn new(limit: RateLimit) -> AddressLimiter {
        let interval = limit.per / limit.requests.get();
        AddressLimiter {
            interval,
            window: interval * limit.requests.get(),
            full_at: Mutex::new(HashMap::new()),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Instant>> {
        // A panic while holding it cannot leave the map inconsistent.
        self.full_at.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long `addr` must wait before its next request, if its budget is
    /// spent.
    pub fn wait(&self, addr: IpAddr, now: Instant) -> Option<Duration> {
        let full_at = *self.table().get(&addr)?;
        // Spent when a further unit would reach past the window.
        let needed = (full_at + self.interval).saturating_duration_since(now);
        needed
            .checked_sub(self.window)
            .filter(|wait| !wait.is_zero())
    }

    /// Spends one unit of `addr`'s budget.
    pub fn spend(&self, addr: IpAddr, now: Instant) {
        let mut table = self.table();
        if table.len() >= MAX_TRACKED && !table.contains_key(&addr) {
            // Addresses back at full budget need no entry.
            table.retain(|_, full_at| *full_at > now);
            if table.len() >= MAX_TRACKED {
                return;
            }
        }
        let full_at = table.entry(addr).or_insert(now);
        // Never more than one window ahead: a refused flood does not push
        // the address's return further out than one burst's worth.
        *full_at = ((*full_at).max(now) + self.interval).min(now + self.window);
    }
}

/// What [`limit_by_address`] holds.
#[derive(Debug, Clone)]
pub(crate) struct AddressGate {
    /// `None`: `API_ADDRESS_LIMIT=none`.
    pub limiter: Option<Arc<AddressLimiter>>,
    pub trusted_proxies: TrustedProxies,
}

/// Refuses a request whose address has spent its budget, before anything
/// else; after the answer, spends a unit if the request failed without a key
/// or got in without one.
pub(crate) async fn limit_by_address(
    State(gate): State<AddressGate>,
    request: Request,
    next: Next,
) -> Response {
    let Some(limiter) = gate.limiter.clone() else {
        return next.run(request).await;
    };
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(peer)| peer.ip());
    let Some(peer) = peer else {
        return next.run(request).await;
    };
    let client = gate.trusted_proxies.client(peer, request.headers());
    if client.is_loopback() {
        return next.run(request).await;
    }
    let addr = client_key(client);
    if let Some(wait) = limiter.wait(addr, Instant::now()) {
        tracing::debug!(%client, ?wait, "refused: the address spent its budget of failed requests");
        return ApiError::AddressRateLimited {
            retry_after_seconds: wait.as_secs() + u64::from(wait.subsec_nanos() > 0),
        }
        .into_response();
    }
    let response = next.run(request).await;
    let spends = match response.extensions().get::<Admitted>() {
        Some(Admitted::Key | Admitted::Open) => false,
        Some(Admitted::Anonymous) => true,
        None => response.status().is_client_error(),
    };
    if spends {
        limiter.spend(addr, Instant::now());
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("IP")
    }

    #[test]
    fn an_address_is_refused_once_its_burst_is_spent_and_let_in_as_it_refills() {
        let limiter = AddressLimiter::new("3/m".parse().expect("valid"));
        let start = Instant::now();
        let addr = ip("203.0.113.7");
        for _ in 0..3 {
            assert_eq!(limiter.wait(addr, start), None);
            limiter.spend(addr, start);
        }
        let wait = limiter.wait(addr, start).expect("spent");
        assert!(
            wait > Duration::from_secs(19) && wait <= Duration::from_secs(20),
            "{wait:?}"
        );
        assert_eq!(
            limiter.wait(ip("203.0.113.8"), start),
            None,
            "its own budget"
        );
        assert_eq!(limiter.wait(addr, start + Duration::from_secs(20)), None);
    }

    #[test]
    fn spending_past_the_budget_does_not_push_the_return_further_out() {
        let limiter = AddressLimiter::new("2/m".parse().expect("valid"));
        let start = Instant::now();
        let addr = ip("203.0.113.7");
        for _ in 0..100 {
            limiter.spend(addr, start);
        }
        let wait = limiter.wait(addr, start).expect("spent");
        assert!(wait <= Duration::from_secs(30), "{wait:?}");
    }
}
