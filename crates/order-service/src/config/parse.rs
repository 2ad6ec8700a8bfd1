//! How a raw flag or environment value becomes a typed one, or an error
//! that says what was expected.

use std::net::SocketAddr;
use std::time::Duration;

use outbox_core::worker_pool::JobTimeouts;

use crate::kinds::EffectKind;

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

/// A URL with a host and no `user:password@`: credentials in a URL would be
/// logged and shown wherever it is. The rule every endpoint's URL follows
/// (`endpoints add --url`, `WEBHOOK_URL`), before its scheme is checked.
pub fn parse_url_without_credentials(raw: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(raw.trim()).map_err(|e| format!("{raw:?} is not a URL: {e}"))?;
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{raw:?} has no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "the URL carries credentials (user:password@); give the receiver a signing \
                    secret instead, or put a token in the path"
                .into(),
        );
    }
    Ok(url)
}

/// `WEBHOOK_URL`: an endpoint's URL by the endpoint rules (`endpoints add`):
/// no `user:password@`, a host, http:// or https:// (whether http:// is
/// allowed is `WEBHOOK_ALLOW_HTTP`'s, checked with the other settings).
pub fn parse_webhook_url(raw: &str) -> Result<url::Url, String> {
    let url = parse_url_without_credentials(raw)?;
    match url.scheme() {
        "http" | "https" => Ok(url),
        other => Err(format!(
            "scheme {other:?} is not http:// or https:// (a NATS endpoint is added with \
             `outbox-relay endpoints add`)"
        )),
    }
}

/// A `WEBHOOK_PROXY` value: an `http://` or `https://` URL with a host and
/// nothing after it but `/`. Userinfo is allowed (the proxy's login).
pub fn parse_proxy(raw: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(raw.trim()).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "scheme {:?} is not http:// or https://",
            url.scheme()
        ));
    }
    if url.host().is_none() {
        return Err("has no host".into());
    }
    if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
        return Err("a proxy URL has no path, query or fragment".into());
    }
    Ok(url)
}

/// A proxy URL as it may be logged: its origin, with `***@` where a login
/// was (the raw text when it is not a URL, cut at any `@`).
pub fn redacted_proxy(raw: &str) -> String {
    match url::Url::parse(raw.trim()) {
        Ok(url) => {
            let origin = url.origin().ascii_serialization();
            if url.username().is_empty() && url.password().is_none() {
                origin
            } else {
                origin.replacen("://", "://***@", 1)
            }
        }
        Err(_) => match raw.rsplit_once('@') {
            Some((_, host)) => format!("***@{host}"),
            None => raw.to_owned(),
        },
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

/// `FANOUT_INLINE`: 0 (every event fans out after commit) to 100,000.
pub(super) fn parse_fanout_inline(raw: &str) -> Result<usize, String> {
    let n: usize = raw
        .trim()
        .parse()
        .map_err(|_| "expected a whole number of endpoints, 0 or more".to_owned())?;
    if n > 100_000 {
        return Err("must be at most 100000".into());
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

/// Words of the example and placeholder values that shipped in this
/// repository's files (`docker-compose.yml`, `.env.example`) or that people
/// paste from documentation: such a value is public, so it protects nothing.
const PLACEHOLDER_WORDS: [&str; 9] = [
    "change-me",
    "changeme",
    "change_me",
    "replace-me",
    "replaceme",
    "placeholder",
    "your-secret",
    "your_secret",
    "insert-secret",
];

/// Refuses a secret that is a known placeholder, naming the variable and not
/// the value.
pub fn refuse_placeholder(variable: &str, value: &str) -> Result<(), super::ConfigError> {
    let lower = value.to_ascii_lowercase();
    if PLACEHOLDER_WORDS.iter().any(|word| lower.contains(word)) {
        return Err(super::ConfigError(format!(
            "{variable} is a placeholder from an example, and anyone can read it: set a \
             secret of your own (e.g. `openssl rand -base64 32`)"
        )));
    }
    Ok(())
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

    #[test]
    fn proxy_urls_are_checked_and_printed_without_their_login() {
        assert!(parse_proxy("http://relay:pw@proxy.internal:3128").is_ok());
        assert!(parse_proxy("https://proxy.example.com/").is_ok());
        for bad in [
            "socks5://proxy:1080",
            "proxy:3128",
            "http://proxy:3128/path",
            "http://proxy:3128/?q=1",
        ] {
            assert!(parse_proxy(bad).is_err(), "{bad}");
        }
        assert_eq!(
            redacted_proxy("http://relay:hunter2@proxy.internal:3128"),
            "http://***@proxy.internal:3128"
        );
        assert_eq!(redacted_proxy("http://proxy:3128"), "http://proxy:3128");
        assert!(!redacted_proxy("relay:hunter2@proxy:3128:x").contains("hunter2"));
    }
}
