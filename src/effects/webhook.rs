//! order_webhook: the placed order, signed, POSTed to the configured receiver.
//!
//! Every attempt for a job sends the same bytes with the same `Idempotency-Key`,
//! so a receiver that processed an earlier attempt whose answer was lost can
//! recognise the repeat. `X-Signature` is an HMAC-SHA256 over exactly the bytes
//! sent, keyed with `WEBHOOK_SECRET`, so the receiver can check who sent them;
//! the Standard Webhooks headers (`webhook-id`, `webhook-timestamp`,
//! `webhook-signature`, see [`super::signature`]) also bind the send time, so
//! a receiver can refuse replays.
//!
//! | answer                                   | class                          |
//! | ---------------------------------------- | ------------------------------ |
//! | 2xx                                      | done                           |
//! | 408, 425, 429, 5xx                       | retryable (honours Retry-After)|
//! | timeout, refused or reset connection, TLS| retryable                      |
//! | 3xx (redirects are not followed)         | permanent                      |
//! | any other 4xx                            | permanent                      |

use std::fmt;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, LOCATION, RETRY_AFTER};
use serde::Serialize;

use super::signature::Secrets;
use super::{EffectError, error_chain};
use crate::orders::{Order, OrderEvent};

/// Longest wait for the TCP (and TLS) connection, within the total timeout.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub const USER_AGENT: &str = concat!("outbox-relay/", env!("CARGO_PKG_VERSION"));
pub const EVENT_ORDER_PLACED: &str = "order.placed";
/// Characters of a receiver's error body kept in `last_error`.
pub const EXCERPT_CHARS: usize = 200;
/// Bytes of an error body read at all: a receiver's huge error page is not
/// worth the memory or the wait.
const MAX_ERROR_BODY: usize = 8 * 1024;

#[derive(Clone)]
pub struct WebhookConfig {
    pub url: url::Url,
    pub secret: String,
    /// Total time for one call: connect, send, and read the answer.
    pub timeout: Duration,
}

impl fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("url", &redacted(&self.url))
            .field("secret", &"***")
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Delivers order webhooks over one shared, pooled HTTP client.
#[derive(Clone)]
pub struct WebhookSender {
    client: reqwest::Client,
    url: url::Url,
    /// Holds the keys, so it is never printed.
    secrets: Secrets,
    timeout: Duration,
}

impl fmt::Debug for WebhookSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookSender")
            .field("url", &redacted(&self.url))
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl WebhookSender {
    pub fn new(config: &WebhookConfig) -> anyhow::Result<WebhookSender> {
        ensure_crypto_provider();
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT.min(config.timeout))
            .timeout(config.timeout)
            .user_agent(USER_AGENT)
            // Following a redirect would hand the signed order to wherever the
            // Location points; a moved receiver is a configuration change.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .context("cannot build the webhook HTTP client")?;
        let secrets = Secrets::parse(&config.secret).context("WEBHOOK_SECRET")?;
        Ok(WebhookSender {
            client,
            url: config.url.clone(),
            secrets,
            timeout: config.timeout,
        })
    }

    /// POSTs `event` of `order` (without one, the legacy `order.placed` body)
    /// for job `job_id`.
    pub async fn deliver(
        &self,
        job_id: i64,
        order: &Order,
        event: Option<&OrderEvent>,
    ) -> Result<(), EffectError> {
        let body = event_body(order, event).map_err(|e| {
            EffectError::permanent(format!("order {} does not serialize: {e}", order.id))
        })?;
        let id = idempotency_key(job_id);
        // This attempt's time, not the job's: receivers refuse stale timestamps.
        let timestamp = chrono::Utc::now().timestamp();
        let response = self
            .client
            .post(self.url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("Idempotency-Key", &id)
            .header("X-Signature", self.sign(&body))
            // The receiver continues the job's trace (W3C Trace Context).
            .headers(crate::trace_context::outgoing_headers())
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header(
                "webhook-signature",
                self.secrets.sign_v1(&id, timestamp, &body),
            )
            .body(body)
            .send()
            .await
            .map_err(|e| self.transport_error(e))?;

        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        let location = response
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(|v| excerpt(v, EXCERPT_CHARS));
        let body = read_error_body(response).await;
        Err(classify(status, retry_after, location.as_deref(), &body))
    }

    /// `sha256=<hex HMAC-SHA256(body)>`.
    pub fn sign(&self, body: &[u8]) -> String {
        self.secrets.x_signature(body)
    }

    fn transport_error(&self, error: reqwest::Error) -> EffectError {
        // The URL may carry a token in its path or query: say only where it went.
        let error = error.without_url();
        let target = redacted(&self.url);
        if error.is_timeout() {
            EffectError::retryable(format!(
                "webhook POST to {target} timed out (WEBHOOK_TIMEOUT {}, connect timeout {})",
                humantime::format_duration(self.timeout),
                humantime::format_duration(CONNECT_TIMEOUT.min(self.timeout)),
            ))
        } else if error.is_connect() {
            EffectError::retryable(format!(
                "cannot connect to the webhook receiver at {target}: {}",
                error_chain(&error)
            ))
        } else {
            EffectError::retryable(format!(
                "webhook POST to {target} failed: {}",
                error_chain(&error)
            ))
        }
    }
}

/// Stable for a job across all its attempts, distinct between jobs.
pub fn idempotency_key(job_id: i64) -> String {
    format!("order-webhook-{job_id}")
}

/// reqwest is built with `rustls-no-provider` and panics when it builds a
/// client without a process-wide rustls crypto provider. Installs ring's,
/// unless the application installed one of its own first.
pub(crate) fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: one is installed either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The error class of a non-2xx answer.
fn classify(
    status: StatusCode,
    retry_after: Option<Duration>,
    location: Option<&str>,
    body: &str,
) -> EffectError {
    let mut message = format!("webhook receiver answered {status}");
    if let Some(location) = location.filter(|_| status.is_redirection()) {
        message.push_str(&format!(
            " redirecting to {location} (redirects are not followed; update WEBHOOK_URL)"
        ));
    }
    if body.is_empty() {
        message.push_str(" with an empty body");
    } else {
        message.push_str(&format!(": {body}"));
    }
    let retryable = status.is_server_error()
        || matches!(
            status,
            StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_EARLY | StatusCode::TOO_MANY_REQUESTS
        );
    if retryable {
        if let Some(wait) = retry_after {
            message.push_str(&format!(
                " (Retry-After {})",
                humantime::format_duration(wait)
            ));
        }
        EffectError::Retryable {
            message,
            retry_after,
        }
    } else {
        EffectError::Permanent { message }
    }
}

/// Reads at most [`MAX_ERROR_BODY`] bytes of the answer and returns a short,
/// single-line excerpt of it. A body that fails half-way yields what arrived.
async fn read_error_body(mut response: reqwest::Response) -> String {
    let mut bytes = Vec::new();
    while bytes.len() < MAX_ERROR_BODY {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    bytes.truncate(MAX_ERROR_BODY);
    excerpt(&String::from_utf8_lossy(&bytes), EXCERPT_CHARS)
}

/// `text` on one line (whitespace and control characters collapsed), cut to
/// `max_chars` characters, with `…` when cut.
pub fn excerpt(text: &str, max_chars: usize) -> String {
    let mut out = String::new();
    let mut chars = 0;
    let words = text
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty());
    for word in words {
        for c in (!out.is_empty())
            .then_some(' ')
            .into_iter()
            .chain(word.chars())
        {
            if chars == max_chars {
                out.push('…');
                return out;
            }
            out.push(c);
            chars += 1;
        }
    }
    out
}

/// A `Retry-After` value as a wait from `now`: delta-seconds or an HTTP date
/// (RFC 9110, 10.2.3). A date in the past means "now"; garbage means no wish.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Too many digits for u64 is still "a very long time"; the relay caps it.
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Scheme, host and port only: paths and queries of webhook URLs often carry tokens.
fn redacted(url: &url::Url) -> String {
    url.origin().ascii_serialization()
}

/// The body of one event, Standard Webhooks style:
/// `{"type":"order.paid","id":<event id>,"timestamp":"<RFC 3339>","data":{...}}`,
/// where `data` holds the event's own fields, its `seq` and the whole `order`.
/// An `order.placed` body also keeps the original `"event"` and `"order"`
/// fields, so receivers written for the first version read it unchanged. A
/// job enqueued before events existed has no event: it gets the original body.
fn event_body(order: &Order, event: Option<&OrderEvent>) -> serde_json::Result<Vec<u8>> {
    let legacy = serde_json::to_value(OrderPlaced::new(order))?;
    let Some(event) = event else {
        return serde_json::to_vec(&legacy);
    };
    let mut data = match &event.data {
        serde_json::Value::Object(fields) => fields.clone(),
        _ => serde_json::Map::new(),
    };
    data.insert("seq".into(), event.seq.into());
    data.insert("order".into(), legacy["order"].clone());
    let mut body = serde_json::Map::new();
    if event.event_type == EVENT_ORDER_PLACED {
        body.insert("event".into(), EVENT_ORDER_PLACED.into());
        body.insert("order".into(), legacy["order"].clone());
    }
    body.insert("type".into(), event.event_type.clone().into());
    body.insert("id".into(), event.id.into());
    body.insert(
        "timestamp".into(),
        event
            .created_at
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
            .into(),
    );
    body.insert("data".into(), serde_json::Value::Object(data));
    serde_json::to_vec(&body)
}

/// The JSON body: `{"event":"order.placed","order":{...}}`.
#[derive(Debug, Serialize)]
struct OrderPlaced<'a> {
    event: &'static str,
    order: OrderBody<'a>,
}

#[derive(Debug, Serialize)]
struct OrderBody<'a> {
    id: i64,
    customer_email: &'a str,
    customer_name: &'a str,
    currency: &'a str,
    total_cents: i64,
    created_at: chrono::DateTime<chrono::Utc>,
    items: Vec<ItemBody<'a>>,
}

#[derive(Debug, Serialize)]
struct ItemBody<'a> {
    sku: &'a str,
    name: &'a str,
    quantity: i32,
    unit_price_cents: i64,
    line_total_cents: i64,
}

impl<'a> OrderPlaced<'a> {
    fn new(order: &'a Order) -> Self {
        OrderPlaced {
            event: EVENT_ORDER_PLACED,
            order: OrderBody {
                id: order.id,
                customer_email: &order.customer_email,
                customer_name: &order.customer_name,
                currency: &order.currency,
                total_cents: order.total_cents,
                created_at: order.created_at,
                items: order
                    .items
                    .iter()
                    .map(|item| ItemBody {
                        sku: &item.sku,
                        name: &item.name,
                        quantity: item.quantity,
                        unit_price_cents: item.unit_price_cents,
                        line_total_cents: item.line_total_cents(),
                    })
                    .collect(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> WebhookConfig {
        WebhookConfig {
            url: url::Url::parse("https://hooks.example.com/t/SECRET-PATH-TOKEN?k=v").expect("url"),
            secret: "s3cr3t-signing-key".to_owned(),
            timeout: Duration::from_secs(30),
        }
    }

    #[test]
    fn debug_output_shows_neither_the_secret_nor_the_url_path() {
        let config = config();
        let sender = WebhookSender::new(&config).expect("client builds");
        for shown in [format!("{config:?}"), format!("{sender:?}")] {
            assert!(!shown.contains("s3cr3t"), "{shown}");
            assert!(!shown.contains("SECRET-PATH-TOKEN"), "{shown}");
            assert!(shown.contains("https://hooks.example.com"), "{shown}");
        }
    }

    #[test]
    fn statuses_are_classified_as_the_design_says() {
        let retryable = [408, 425, 429, 500, 502, 503, 504, 599];
        let permanent = [
            300, 301, 302, 307, 400, 401, 403, 404, 409, 410, 413, 422, 451,
        ];
        for code in retryable {
            let status = StatusCode::from_u16(code).expect("status");
            assert!(
                matches!(
                    classify(status, None, None, ""),
                    EffectError::Retryable { .. }
                ),
                "{code}"
            );
        }
        for code in permanent {
            let status = StatusCode::from_u16(code).expect("status");
            assert!(
                matches!(
                    classify(status, Some(Duration::from_secs(5)), None, ""),
                    EffectError::Permanent { .. }
                ),
                "{code}"
            );
        }
    }

    #[test]
    fn messages_carry_the_status_the_body_and_the_wait() {
        let error = classify(
            StatusCode::TOO_MANY_REQUESTS,
            Some(Duration::from_secs(30)),
            None,
            "slow down",
        );
        assert_eq!(
            error,
            EffectError::Retryable {
                message: "webhook receiver answered 429 Too Many Requests: slow down \
                          (Retry-After 30s)"
                    .to_owned(),
                retry_after: Some(Duration::from_secs(30)),
            }
        );
        let moved = classify(
            StatusCode::MOVED_PERMANENTLY,
            None,
            Some("https://new.example.com/hook"),
            "",
        );
        assert!(
            moved
                .to_string()
                .contains("301 Moved Permanently redirecting to https://new.example.com/hook"),
            "{moved}"
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        let cases = [
            ("120", Some(Duration::from_secs(120))),
            (" 0 ", Some(Duration::ZERO)),
            (
                "99999999999999999999999",
                Some(Duration::from_secs(u64::MAX)),
            ),
            // 1_445_412_480 is Wed, 21 Oct 2015 07:28:00 GMT.
            (
                "Wed, 21 Oct 2015 07:28:30 GMT",
                Some(Duration::from_secs(30)),
            ),
            ("Wed, 21 Oct 2015 07:00:00 GMT", Some(Duration::ZERO)),
            ("-5", None),
            ("1.5", None),
            ("soon", None),
            ("", None),
        ];
        for (value, expected) in cases {
            assert_eq!(parse_retry_after(value, now), expected, "{value:?}");
        }
    }

    #[test]
    fn excerpts_are_one_bounded_line_cut_on_character_boundaries() {
        assert_eq!(excerpt("  a\r\n\tb\u{0}c  ", 200), "a b c");
        let long = "é".repeat(500);
        let cut = excerpt(&long, 200);
        assert_eq!(cut.chars().count(), 201);
        assert!(cut.ends_with('…'));
        assert_eq!(excerpt("abc", 3), "abc");
        assert_eq!(excerpt("", 3), "");
    }

    #[test]
    fn the_signature_is_hex_hmac_sha256_of_the_body() {
        let sender = WebhookSender::new(&WebhookConfig {
            secret: "Jefe".to_owned(),
            ..config()
        })
        .expect("client builds");
        // RFC 4231, test case 2.
        assert_eq!(
            sender.sign(b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
