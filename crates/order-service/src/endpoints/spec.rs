//! What an operator may say about an endpoint, parsed at the edge: each value
//! here has been checked, so the store never writes a half-valid subscriber.
//! Every error names the flag it came from.

use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::config::parse_url_without_credentials;
use crate::orders::OrderStatus;

pub use crate::signature::WHSEC_PREFIX;

/// `url` as shown to operators: without any `user:password@` (rows written
/// before URLs with credentials were refused may still hold one).
pub fn without_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    format!("{scheme}://{host}{tail}")
}

/// The event an endpoint hears when another endpoint is disabled by its breaker.
pub const EVENT_ENDPOINT_DISABLED: &str = "endpoint.disabled";
/// Deliveries in flight to one endpoint at once when `--max-in-flight` is not given.
pub const DEFAULT_MAX_IN_FLIGHT: i32 = 16;
/// Bytes of key in a secret `endpoints add` makes: HMAC-SHA256's block is 64,
/// its output 32; 32 random bytes is what Standard Webhooks' libraries make.
const NEW_SECRET_BYTES: usize = 32;
/// Key lengths a given `--secret` may have: shorter is guessable, longer is
/// more than HMAC-SHA256 uses without hashing it first.
const SECRET_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

/// A refused value: the flag, and what is wrong with it. Never carries a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag}: {message}")]
pub struct SpecError {
    pub flag: &'static str,
    pub message: String,
}

pub(super) fn refuse(flag: &'static str, message: impl Into<String>) -> SpecError {
    SpecError {
        flag,
        message: message.into(),
    }
}

/// An endpoint's name: what operators type, and part of ordering keys and
/// metric labels, so it is short and plain (the `endpoints_name_valid` CHECK).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointName(String);

impl EndpointName {
    pub fn parse(raw: &str) -> Result<EndpointName, SpecError> {
        let valid = !raw.is_empty()
            && raw.len() <= 64
            && raw
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric())
            && raw
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if valid {
            Ok(EndpointName(raw.to_owned()))
        } else {
            Err(refuse(
                "--name",
                format!(
                    "{raw:?} is not a valid name (1 to 64 letters, digits, '_', '.' or '-', \
                     starting with a letter or digit)"
                ),
            ))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EndpointName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where deliveries go: an `https://` URL, `http://` only when allowed, or a
/// `nats://` server, with no credentials in it (they would be logged and shown wherever the URL is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointUrl {
    url: url::Url,
    /// http://, or nats:// allowed without TLS (`--allow-http`).
    plaintext: bool,
}

impl EndpointUrl {
    pub fn parse(raw: &str, allow_http: bool) -> Result<EndpointUrl, SpecError> {
        let url = parse_url_without_credentials(raw).map_err(|e| refuse("--url", e))?;
        match url.scheme() {
            "https" => {}
            "http" if allow_http => {}
            "http" => {
                return Err(refuse(
                    "--url",
                    "http:// sends events and signatures in the clear; use https://, or add \
                     the endpoint with --allow-http",
                ));
            }
            // Credentials come from the endpoint's own (nats_credentials.rs)
            // or NATS_CREDENTIALS, refused above in the URL. Without
            // --allow-http the connection requires TLS.
            "nats" => {}
            other => {
                return Err(refuse(
                    "--url",
                    format!("scheme {other:?} is not https://, http:// or nats://"),
                ));
            }
        }
        let plaintext = url.scheme() == "http" || (url.scheme() == "nats" && allow_http);
        Ok(EndpointUrl { url, plaintext })
    }

    pub fn as_str(&self) -> &str {
        self.url.as_str()
    }

    /// Whether events go in the clear: http://, or nats:// added with
    /// `--allow-http` (stored as `allow_http`).
    pub fn is_plaintext(&self) -> bool {
        self.plaintext
    }

    pub fn is_http(&self) -> bool {
        self.url.scheme() == "http"
    }

    /// A NATS server, whose endpoint publishes to a JetStream stream.
    pub fn is_nats(&self) -> bool {
        self.url.scheme() == "nats"
    }
}

/// The event types an endpoint hears: every one (`None`), or those named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventTypes(Option<Vec<String>>);

impl EventTypes {
    pub const ALL: EventTypes = EventTypes(None);

    /// Every event type an endpoint may subscribe to.
    pub fn known() -> Vec<&'static str> {
        OrderStatus::ALL
            .into_iter()
            .map(OrderStatus::event_type)
            .chain([EVENT_ENDPOINT_DISABLED])
            .collect()
    }

    /// A comma-separated list (`order.placed,order.paid`); unknown names are
    /// refused, all of them named.
    pub fn parse(raw: &str) -> Result<EventTypes, SpecError> {
        let known = EventTypes::known();
        let mut types: Vec<String> = Vec::new();
        let mut unknown = Vec::new();
        for name in raw.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if !known.contains(&name) {
                unknown.push(format!("{name:?}"));
            } else if !types.iter().any(|t| t == name) {
                types.push(name.to_owned());
            }
        }
        if !unknown.is_empty() {
            return Err(refuse(
                "--events",
                format!(
                    "unknown event type {} (known: {})",
                    unknown.join(", "),
                    known.join(", ")
                ),
            ));
        }
        if types.is_empty() {
            return Err(refuse(
                "--events",
                "names no event type (leave --events out to subscribe to every event)",
            ));
        }
        Ok(EventTypes(Some(types)))
    }

    pub fn as_column(&self) -> Option<Vec<String>> {
        self.0.clone()
    }

    pub fn includes(&self, event_type: &str) -> bool {
        self.0
            .as_ref()
            .is_none_or(|types| types.iter().any(|t| t == event_type))
    }
}

/// Deliveries per second at most (`10/s`, `300/m`, `1000/h`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit(f64);

impl RateLimit {
    /// A rate as the `endpoints` table stores it.
    pub fn from_per_second(per_second: f64) -> RateLimit {
        RateLimit(per_second)
    }

    pub fn per_second(self) -> f64 {
        self.0
    }
}

impl FromStr for RateLimit {
    type Err = SpecError;

    fn from_str(raw: &str) -> Result<RateLimit, SpecError> {
        let bad = |why: &str| {
            refuse(
                "--rate-limit",
                format!("{raw:?} {why} (expected a count per unit such as 10/s, 300/m or 1000/h)"),
            )
        };
        let (count, unit) = raw
            .trim()
            .split_once('/')
            .ok_or_else(|| bad("has no unit"))?;
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|_| bad("does not start with a whole number"))?;
        if count == 0 {
            return Err(bad("allows nothing; disable the endpoint instead"));
        }
        let seconds = match unit.trim() {
            "s" | "sec" | "second" => 1.0,
            "m" | "min" | "minute" => 60.0,
            "h" | "hour" => 3600.0,
            _ => return Err(bad("has an unknown unit")),
        };
        Ok(RateLimit(f64::from(count) / seconds))
    }
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 >= 1.0 || self.0 <= 0.0 {
            write!(f, "{}/s", self.0)
        } else if self.0 * 60.0 >= 1.0 {
            write!(f, "{}/m", (self.0 * 60.0).round())
        } else {
            write!(f, "{}/h", (self.0 * 3600.0).round())
        }
    }
}

/// `--max-in-flight`: a positive count.
pub fn parse_max_in_flight(raw: &str) -> Result<i32, SpecError> {
    match raw.trim().parse::<i32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(refuse(
            "--max-in-flight",
            format!("{raw:?} is not a whole number of at least 1"),
        )),
    }
}

/// A Standard Webhooks signing secret: `whsec_` and the base64 of its key.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningSecret(String);

impl fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SigningSecret(..)")
    }
}

impl SigningSecret {
    /// A new random secret.
    pub fn generate() -> Result<SigningSecret, getrandom::Error> {
        let mut key = [0u8; NEW_SECRET_BYTES];
        getrandom::fill(&mut key)?;
        Ok(SigningSecret(format!(
            "{WHSEC_PREFIX}{}",
            STANDARD.encode(key)
        )))
    }

    /// A secret given on the command line: `whsec_` and 24 to 64 bytes of
    /// base64. The error never repeats the secret.
    pub fn parse(raw: &str, flag: &'static str) -> Result<SigningSecret, SpecError> {
        let raw = raw.trim();
        let tail = raw.strip_prefix(WHSEC_PREFIX).ok_or_else(|| {
            refuse(
                flag,
                "is not a Standard Webhooks secret: it must start with whsec_ followed by \
                 base64 (leave --secret out and one is made for you)",
            )
        })?;
        let key = STANDARD
            .decode(tail)
            .map_err(|e| refuse(flag, format!("the part after whsec_ is not base64 ({e})")))?;
        if !SECRET_BYTES.contains(&key.len()) {
            return Err(refuse(
                flag,
                format!(
                    "the key is {} bytes; it must be {} to {} bytes",
                    key.len(),
                    SECRET_BYTES.start(),
                    SECRET_BYTES.end()
                ),
            ));
        }
        Ok(SigningSecret(raw.to_owned()))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_urls_carry_no_userinfo() {
        assert_eq!(
            without_userinfo("https://ops:hunter2@hooks.example.com:8443/in?t=1"),
            "https://hooks.example.com:8443/in?t=1"
        );
        assert_eq!(
            without_userinfo("https://a@b:c@hooks.example.com/x@y"),
            "https://hooks.example.com/x@y"
        );
        assert_eq!(
            without_userinfo("nats://127.0.0.1:4222"),
            "nats://127.0.0.1:4222"
        );
    }

    #[test]
    fn names_are_short_and_plain() {
        assert!(EndpointName::parse("erp-prod.eu_1").is_ok());
        for bad in ["", "-lead", "has space", "ünï", &"x".repeat(65)] {
            let error = EndpointName::parse(bad).expect_err(bad);
            assert_eq!(error.flag, "--name");
        }
    }

    #[test]
    fn urls_must_be_https_without_credentials_unless_http_is_allowed() {
        assert!(EndpointUrl::parse("https://erp.example.com/hooks", false).is_ok());
        assert!(EndpointUrl::parse("http://erp.example.com/hooks", true).is_ok());
        let nats = EndpointUrl::parse("nats://127.0.0.1:4222", false).expect("a NATS server");
        assert!(nats.is_nats() && !nats.is_http());
        let cases = [
            ("http://erp.example.com/hooks", "--allow-http"),
            ("ftp://erp.example.com/", "scheme \"ftp\""),
            ("https://user:pw@erp.example.com/", "credentials"),
            ("nats://user:pw@127.0.0.1:4222", "credentials"),
            ("not a url", "is not a URL"),
            ("nats://", "has no host"),
        ];
        for (raw, said) in cases {
            let error = EndpointUrl::parse(raw, false).expect_err(raw);
            assert_eq!(error.flag, "--url");
            assert!(error.to_string().contains(said), "{raw}: {error}");
            assert!(!error.to_string().contains("pw@"), "{error}");
        }
    }

    #[test]
    fn event_types_are_checked_against_the_known_ones_and_every_unknown_is_named() {
        let types = EventTypes::parse("order.paid, order.shipped,order.paid").expect("known");
        assert_eq!(
            types.as_column(),
            Some(vec!["order.paid".to_owned(), "order.shipped".to_owned()])
        );
        assert!(types.includes("order.paid") && !types.includes("order.placed"));
        assert!(EventTypes::ALL.includes("order.placed"));
        let error = EventTypes::parse("order.paid,order.returned,orders.placed").expect_err("bad");
        let said = error.to_string();
        assert!(said.starts_with("--events: unknown event type"), "{said}");
        assert!(
            said.contains("\"order.returned\", \"orders.placed\""),
            "{said}"
        );
        assert!(EventTypes::parse(" , ").is_err());
    }

    #[test]
    fn rates_need_a_positive_count_and_a_unit() {
        let rate: RateLimit = "5/s".parse().expect("valid");
        assert!((rate.per_second() - 5.0).abs() < f64::EPSILON);
        let rate: RateLimit = "30/m".parse().expect("valid");
        assert!((rate.per_second() - 0.5).abs() < f64::EPSILON);
        assert_eq!(rate.to_string(), "30/m");
        for bad in ["0/s", "ten", "10", "10/fortnight", "-1/s", "1.5/s"] {
            let error = bad.parse::<RateLimit>().expect_err(bad);
            assert_eq!(error.flag, "--rate-limit");
            assert!(error.message.contains(bad), "{error}");
        }
    }

    #[test]
    fn secrets_are_whsec_and_24_to_64_bytes_of_base64_and_never_repeated_in_errors() {
        let made = SigningSecret::generate().expect("random");
        assert!(SigningSecret::parse(made.expose(), "--secret").is_ok());
        let short = format!("whsec_{}", STANDARD.encode([7u8; 16]));
        let long = format!("whsec_{}", STANDARD.encode([7u8; 65]));
        for (raw, said) in [
            ("hunter2-hunter2-hunter2-hunter2", "must start with whsec_"),
            ("whsec_not*base64", "not base64"),
            (short.as_str(), "16 bytes"),
            (long.as_str(), "65 bytes"),
        ] {
            let error = SigningSecret::parse(raw, "--secret").expect_err(raw);
            assert!(error.to_string().contains(said), "{error}");
            assert!(!error.to_string().contains(raw), "{error}");
        }
    }
}
