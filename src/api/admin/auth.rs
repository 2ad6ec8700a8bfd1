//! Who is asking: the login form, the session cookie, and the limit on failed
//! logins.
//!
//! The session is stateless: the cookie is `{token index}.{expiry}.{mac}`,
//! where the MAC is HMAC-SHA256 keyed by the token's own secret. So every
//! `serve` instance behind a load balancer accepts it, a restart keeps
//! operators logged in, and removing or rotating a token ends its sessions at
//! once. The secret never leaves the server.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use hmac::{Hmac, Mac as _};
use sha2::{Digest as _, Sha256};

use super::AdminState;
use super::error::AdminError;
use super::settings::{AdminSettings, AdminToken, CookieSecure, Role};

pub(super) const COOKIE_NAME: &str = "outbox_admin";

/// Failed logins allowed within `FAILURE_WINDOW`, across all clients. Past it,
/// every login attempt is answered 429 until the oldest failure ages out: a
/// guesser gets at most this many tries a minute. The limit is global, not per
/// client address, because `serve` usually sits behind a proxy whose address
/// every client shares; the cost is that a flood of bad guesses can delay a
/// real operator's login by up to a minute, while sessions already open keep
/// working.
pub(super) const MAX_FAILURES: usize = 10;
pub(super) const FAILURE_WINDOW: Duration = Duration::from_secs(60);

type HmacSha256 = Hmac<Sha256>;

/// A logged-in operator.
#[derive(Debug, Clone)]
pub(super) struct Session {
    /// Who acts, for the audit log (`operator#1`).
    pub actor: String,
    pub role: Role,
    /// The form token every POST must carry (see `csrf`).
    pub csrf: String,
}

impl Session {
    pub fn can_act(&self) -> bool {
        self.role == Role::Operator
    }
}

/// Compares two secrets in time that depends on neither: both are hashed
/// first (so their lengths do not leak either), then every byte is compared.
pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq as _;
    let a = Sha256::digest(a);
    let b = Sha256::digest(b);
    a.ct_eq(&b).into()
}

/// The token a login form's secret matches, comparing against every token
/// (no early exit), so the time taken says nothing about which one matched.
pub(super) fn find_token<'a>(
    settings: &'a AdminSettings,
    given: &str,
) -> Option<(usize, &'a AdminToken)> {
    let mut found = None;
    for (i, token) in settings.tokens.iter().enumerate() {
        if constant_time_eq(token.secret.as_bytes(), given.as_bytes()) && found.is_none() {
            found = Some((i, token));
        }
    }
    found
}

fn mac(token: &AdminToken, purpose: &str, message: &str) -> HmacSha256 {
    let mut mac: HmacSha256 = token.mac.clone();
    mac.update(purpose.as_bytes());
    mac.update(&[0]);
    mac.update(message.as_bytes());
    mac
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A fresh session cookie's value for token `index`.
pub(super) fn issue_session(settings: &AdminSettings, index: usize) -> Option<String> {
    let token = settings.tokens.get(index)?;
    let expires = unix_now().saturating_add(settings.session_length.as_secs());
    let body = format!("{index}.{expires}");
    let tag = hex::encode(mac(token, "session", &body).finalize().into_bytes());
    Some(format!("{body}.{tag}"))
}

/// The session a cookie value stands for, if it is genuine and unexpired.
pub(super) fn verify_session(settings: &AdminSettings, value: &str) -> Option<Session> {
    let mut parts = value.splitn(3, '.');
    let index: usize = parts.next()?.parse().ok()?;
    let expires: u64 = parts.next()?.parse().ok()?;
    let tag = hex::decode(parts.next()?).ok()?;
    let token = settings.tokens.get(index)?;
    mac(token, "session", &format!("{index}.{expires}"))
        .verify_slice(&tag)
        .ok()?;
    if expires <= unix_now() {
        return None;
    }
    Some(Session {
        actor: token.label.clone(),
        role: settings.effective_role(token),
        csrf: super::csrf::token_for(token, value),
    })
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub(super) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// Whether the cookie gets `Secure` (see [`CookieSecure::Auto`]).
fn secure(settings: &AdminSettings, headers: &HeaderMap) -> bool {
    if settings.cookie_secure == CookieSecure::Always {
        return true;
    }
    let forwarded_https = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"));
    if forwarded_https {
        return true;
    }
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    !is_loopback_host(host)
}

fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default()
    } else {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `Set-Cookie` for a new session, or (with `None`) one that ends it.
pub(super) fn set_cookie(
    settings: &AdminSettings,
    headers: &HeaderMap,
    value: Option<&str>,
) -> String {
    let secure = if secure(settings, headers) {
        "; Secure"
    } else {
        ""
    };
    match value {
        Some(value) => format!(
            "{COOKIE_NAME}={value}; Path=/admin; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
            settings.session_length.as_secs()
        ),
        None => {
            format!("{COOKIE_NAME}=; Path=/admin; HttpOnly; SameSite=Strict; Max-Age=0{secure}")
        }
    }
}

/// Failed logins in the last `FAILURE_WINDOW`.
#[derive(Debug, Default)]
pub(super) struct LoginLimiter {
    failures: Mutex<VecDeque<Instant>>,
}

impl LoginLimiter {
    /// `Some(wait)` when logins are refused for now.
    pub fn blocked_for(&self) -> Option<Duration> {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        while failures
            .front()
            .is_some_and(|t| now.duration_since(*t) >= FAILURE_WINDOW)
        {
            failures.pop_front();
        }
        if failures.len() < MAX_FAILURES {
            return None;
        }
        let oldest = failures.front().copied().unwrap_or(now);
        Some(FAILURE_WINDOW.saturating_sub(now.duration_since(oldest)))
    }

    pub fn record_failure(&self) {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        failures.push_back(Instant::now());
        while failures.len() > MAX_FAILURES {
            failures.pop_front();
        }
    }
}

impl FromRequestParts<AdminState> for Session {
    type Rejection = AdminError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AdminState,
    ) -> Result<Self, Self::Rejection> {
        cookie(&parts.headers, COOKIE_NAME)
            .and_then(|value| verify_session(&state.settings, value))
            .ok_or(AdminError::LoginRequired)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::admin::settings::parse_admin_tokens;

    fn settings() -> AdminSettings {
        AdminSettings::new(parse_admin_tokens(Some("op:alpha,ro:beta"), None).expect("tokens"))
    }

    #[test]
    fn a_session_verifies_until_its_token_changes() {
        let settings = settings();
        let value = issue_session(&settings, 1).expect("session");
        let session = verify_session(&settings, &value).expect("genuine");
        assert_eq!(session.role, Role::ReadOnly);
        assert_eq!(session.actor, "read-only#2");

        let forged = value.replacen("1.", "0.", 1);
        assert!(verify_session(&settings, &forged).is_none());
        let rotated = AdminSettings::new(
            parse_admin_tokens(Some("op:alpha,ro:gamma"), None).expect("tokens"),
        );
        assert!(verify_session(&rotated, &value).is_none());
        assert!(verify_session(&settings, "garbage").is_none());
    }

    #[test]
    fn logins_match_tokens_and_loopback_http_gets_no_secure_flag() {
        let settings = settings();
        assert_eq!(find_token(&settings, "beta").map(|(i, _)| i), Some(1));
        assert!(find_token(&settings, "bet").is_none());
        assert!(is_loopback_host("127.0.0.1:8080"));
        assert!(is_loopback_host("[::1]:80"));
        assert!(is_loopback_host("localhost"));
        assert!(!is_loopback_host("ops.example.com"));
    }

    #[test]
    fn the_limiter_blocks_after_too_many_failures() {
        let limiter = LoginLimiter::default();
        for _ in 0..MAX_FAILURES {
            assert!(limiter.blocked_for().is_none());
            limiter.record_failure();
        }
        assert!(limiter.blocked_for().is_some());
    }
}
