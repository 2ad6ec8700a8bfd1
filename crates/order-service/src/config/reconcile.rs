//! What reconciliation reads: Stripe's API (`STRIPE_API_BASE`, for
//! `inbox reconcile` and relays) and how often relays reconcile
//! (`INBOX_RECONCILE_EVERY`).

use std::time::Duration;

use clap::Args;

/// Stripe's API, where `STRIPE_API_BASE` points unless told otherwise.
pub const DEFAULT_STRIPE_API_BASE: &str = "https://api.stripe.com";

/// Where Stripe's event log is read.
#[derive(Debug, Clone, Args)]
pub struct StripeApiArgs {
    /// Stripe's API, whose event log reconciles sources with an API key
    /// (http:// only on a loopback address: a test server, a local proxy).
    #[arg(long, env = "STRIPE_API_BASE", default_value = DEFAULT_STRIPE_API_BASE, value_parser = parse_api_base)]
    pub stripe_api_base: url::Url,
}

/// What a relay reads to reconcile on its own.
#[derive(Debug, Clone, Args)]
pub struct ReconcileArgs {
    /// How often relays reconcile every stripe source that has an API key
    /// against Stripe's event log (one run per interval across relays); off
    /// disables it.
    #[arg(long, env = "INBOX_RECONCILE_EVERY", default_value = "15m", value_parser = parse_reconcile_every)]
    pub inbox_reconcile_every: ReconcileEvery,
    #[command(flatten)]
    pub stripe: StripeApiArgs,
}

/// `INBOX_RECONCILE_EVERY`: an interval, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconcileEvery(pub Option<Duration>);

/// `off`, or a duration of at least 100ms (the core's shortest periodic
/// interval) in whole milliseconds.
pub fn parse_reconcile_every(raw: &str) -> Result<ReconcileEvery, String> {
    let raw = raw.trim();
    if raw.eq_ignore_ascii_case("off") {
        return Ok(ReconcileEvery(None));
    }
    let every = super::parse::parse_duration(raw).map_err(|e| format!("{raw:?}: {e}, or off"))?;
    if every < outbox_core::outbox::MIN_PERIODIC_INTERVAL {
        return Err(format!(
            "{raw:?}: must be at least {} (or off)",
            humantime::format_duration(outbox_core::outbox::MIN_PERIODIC_INTERVAL)
        ));
    }
    if !every.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(format!("{raw:?}: must be whole milliseconds"));
    }
    Ok(ReconcileEvery(Some(every)))
}

/// A `STRIPE_API_BASE`: `https://` anywhere, `http://` only on a loopback
/// address (the API key would cross the network in the clear), no
/// credentials, query or fragment.
pub fn parse_api_base(raw: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(raw.trim()).map_err(|e| format!("{raw:?} is not a URL: {e}"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!(
            "{raw:?} carries credentials (user:password@); the API key is the source's"
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!(
            "{raw:?} has a query or fragment; give the base only"
        ));
    }
    match (url.scheme(), is_loopback(&url)) {
        ("https", _) if url.host().is_some() => Ok(url),
        ("http", true) => Ok(url),
        ("http", false) => Err(format!(
            "{raw:?}: http:// is accepted only on a loopback address (127.0.0.1, [::1], \
             localhost); the API key would cross the network in the clear"
        )),
        (other, _) => Err(format!("{raw:?}: scheme {other:?} is not https://")),
    }
}

/// Whether `url`'s host is this machine.
pub fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_bases_are_accepted_on_loopback_only() {
        assert!(parse_api_base("https://api.stripe.com").is_ok());
        assert!(parse_api_base("http://127.0.0.1:12111").is_ok());
        assert!(parse_api_base("http://[::1]:12111/").is_ok());
        assert!(parse_api_base("http://localhost:8080").is_ok());
        let remote = parse_api_base("http://stripe.internal:8080").expect_err("plain http");
        assert!(remote.contains("only on a loopback address"), "{remote}");
        assert!(parse_api_base("http://10.0.0.5").is_err());
        assert!(parse_api_base("https://u:p@api.stripe.com").is_err());
        assert!(parse_api_base("ftp://api.stripe.com").is_err());
    }

    #[test]
    fn the_interval_is_a_duration_or_off() {
        assert_eq!(
            parse_reconcile_every("15m"),
            Ok(ReconcileEvery(Some(Duration::from_secs(900))))
        );
        assert_eq!(parse_reconcile_every("off"), Ok(ReconcileEvery(None)));
        assert!(parse_reconcile_every("0s").is_err());
        assert!(parse_reconcile_every("-5m").is_err());
        assert!(parse_reconcile_every("soon").is_err());
    }
}
