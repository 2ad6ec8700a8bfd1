//! How a raw flag or environment value becomes a typed one, or an error
//! that says what was expected.

use std::net::SocketAddr;
use std::time::Duration;

use crate::effects::EffectKind;
use crate::relay::JobTimeouts;

/// Parses a human duration: `500ms`, `30s`, `5m`, `1h`, `7d`.
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    humantime::parse_duration(raw.trim())
        .map_err(|e| format!("{e} (expected a duration such as 500ms, 30s, 5m, 1h or 7d)"))
}

/// A duration that must be more than zero.
pub fn parse_positive_duration(raw: &str) -> Result<Duration, String> {
    let d = parse_duration(raw)?;
    if d.is_zero() {
        return Err("must be more than zero".into());
    }
    Ok(d)
}

pub use super::database_url::parse_database_url;

/// An `http://` or `https://` URL.
pub fn parse_http_url(raw: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(raw).map_err(|e| format!("not a URL: {e}"))?;
    match url.scheme() {
        "http" | "https" if url.host().is_some() => Ok(url),
        "http" | "https" => Err("has no host".into()),
        other => Err(format!("scheme {other:?} is not http:// or https://")),
    }
}

pub fn parse_socket_addr(raw: &str) -> Result<SocketAddr, String> {
    raw.parse()
        .map_err(|e| format!("{e} (expected host:port such as 127.0.0.1:8080)"))
}

/// A whole number from 1 to 100,000.
pub fn parse_count(raw: &str) -> Result<usize, String> {
    let n: usize = raw
        .trim()
        .parse()
        .map_err(|_| "expected a whole number".to_owned())?;
    if !(1..=100_000).contains(&n) {
        return Err("must be between 1 and 100000".into());
    }
    Ok(n)
}

pub(super) fn parse_max_attempts(raw: &str) -> Result<i32, String> {
    let n: i32 = raw
        .trim()
        .parse()
        .map_err(|_| "expected a whole number".to_owned())?;
    if !(1..=1000).contains(&n) {
        return Err("must be between 1 and 1000".into());
    }
    Ok(n)
}

pub(super) fn parse_kind(raw: &str) -> Result<EffectKind, String> {
    raw.trim().parse()
}

/// A whole number of requests from 1 to 1,000,000.
pub(super) fn parse_requests(raw: &str) -> Result<u64, String> {
    let n: u64 = raw
        .trim()
        .parse()
        .map_err(|_| "expected a whole number".to_owned())?;
    if !(1..=1_000_000).contains(&n) {
        return Err("must be between 1 and 1000000".into());
    }
    Ok(n)
}

pub(super) fn parse_cookie_secure(raw: &str) -> Result<super::dashboard::CookieSecure, String> {
    raw.parse()
}

pub(super) fn parse_job_timeouts(raw: &str) -> Result<JobTimeouts, String> {
    raw.parse()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_human() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_positive_duration("0s").is_err());
    }

    #[test]
    fn urls_are_checked_for_their_scheme() {
        assert!(parse_database_url("postgres://u@localhost/db").is_ok());
        assert!(parse_database_url("mysql://u@localhost/db").is_err());
        assert!(parse_database_url("not a url").is_err());
        assert!(parse_http_url("https://hooks.example.com/x").is_ok());
        assert!(parse_http_url("ftp://example.com").is_err());
    }
}
