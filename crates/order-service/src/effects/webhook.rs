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
//!
//! What bytes are sent is in `body`, what an answer means in `answer`;
//! this file holds the settings, the client and the send.

mod answer;
pub(crate) mod body;
pub mod guard;

use std::fmt;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use reqwest::header::{CONTENT_TYPE, LOCATION, RETRY_AFTER};

pub use self::answer::{MAX_ANSWER_BYTES, parse_retry_after};
use self::answer::{classify, read_body};
use self::body::event_body;
use super::{EffectError, error_chain};
use crate::config::redacted_proxy;
use crate::endpoints::breaker::Breaker;
use crate::orders::{Order, OrderEvent};
pub use crate::signature::Secrets;
use crate::text::one_line;

/// Longest wait for the TCP (and TLS) connection, within the total timeout.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub const USER_AGENT: &str = concat!("outbox-relay/", env!("CARGO_PKG_VERSION"));
pub const EVENT_ORDER_PLACED: &str = "order.placed";
/// Characters of a receiver's error body kept in `last_error`.
pub const EXCERPT_CHARS: usize = 200;

#[derive(Clone)]
pub struct WebhookConfig {
    pub url: url::Url,
    pub secret: String,
    /// Total time for one call: connect, send, and read the answer.
    pub timeout: Duration,
    /// Deliver to loopback, private and link-local addresses too
    /// (`WEBHOOK_ALLOW_PRIVATE`): for tests, the demo and receivers on the
    /// relay's own network. Off, such addresses are refused at connect time.
    pub allow_private: bool,
}

impl fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("url", &redacted(&self.url))
            .field("secret", &"***")
            .field("timeout", &self.timeout)
            .field("allow_private", &self.allow_private)
            .finish()
    }
}

/// What a sender needs to deliver to endpoint rows: no URL or secret of its
/// own, since each endpoint brings both.
#[derive(Clone)]
pub struct DeliveryOptions {
    /// Total time for one call: connect, send, and read the answer.
    pub timeout: Duration,
    /// Deliver to loopback, private and link-local addresses too.
    pub allow_private: bool,
    /// Every call goes through this HTTP proxy (`WEBHOOK_PROXY`), whose
    /// `user:password@` is never printed.
    pub proxy: Option<url::Url>,
}

impl fmt::Debug for DeliveryOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeliveryOptions")
            .field("timeout", &self.timeout)
            .field("allow_private", &self.allow_private)
            .field(
                "proxy",
                &self.proxy.as_ref().map(|p| redacted_proxy(p.as_str())),
            )
            .finish()
    }
}

/// Delivers order webhooks over one shared, pooled HTTP client.
#[derive(Clone)]
pub struct WebhookSender {
    client: reqwest::Client,
    /// The URL and secrets it was built with (`WEBHOOK_URL`), if any: where
    /// [`WebhookSender::deliver`] sends. A relay builds its sender without
    /// them and finds `default` among the endpoint rows instead.
    fallback: Option<Fallback>,
    timeout: Duration,
    allow_private: bool,
    /// Calls go through `WEBHOOK_PROXY`: the connect-time guard would only
    /// see the proxy, so each receiver's host is checked before the call.
    proxied: bool,
    /// What a failing endpoint's deliveries do (`ENDPOINT_DISABLE_AFTER`).
    breaker: Breaker,
}

/// A URL and the secrets that sign for it. Holds the keys, so it is never
/// printed.
#[derive(Clone)]
struct Fallback {
    url: url::Url,
    secrets: Secrets,
}

impl fmt::Debug for WebhookSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookSender")
            .field("url", &self.fallback.as_ref().map(|f| redacted(&f.url)))
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl WebhookSender {
    /// A sender for `config.url`, signing with `config.secret`, that also
    /// delivers to endpoint rows.
    pub fn new(config: &WebhookConfig) -> anyhow::Result<WebhookSender> {
        let secrets = Secrets::parse(&config.secret).context("WEBHOOK_SECRET")?;
        let mut sender = WebhookSender::for_endpoints(&DeliveryOptions {
            timeout: config.timeout,
            allow_private: config.allow_private,
            proxy: None,
        })?;
        sender.fallback = Some(Fallback {
            url: config.url.clone(),
            secrets,
        });
        Ok(sender)
    }

    /// A sender for endpoint rows only, each with its own URL and secrets:
    /// what a relay runs, with or without `WEBHOOK_URL`.
    pub fn for_endpoints(config: &DeliveryOptions) -> anyhow::Result<WebhookSender> {
        let client = guarded_client(config)?;
        Ok(WebhookSender {
            client,
            fallback: None,
            timeout: config.timeout,
            allow_private: config.allow_private,
            proxied: config.proxy.is_some(),
            breaker: Breaker::default(),
        })
    }

    /// This sender with `breaker` for the endpoints it delivers to.
    pub fn with_breaker(mut self, breaker: Breaker) -> Self {
        self.breaker = breaker;
        self
    }

    pub fn breaker(&self) -> Breaker {
        self.breaker
    }

    /// Whether this sender was built with a URL of its own ([`Self::new`]).
    pub fn has_fallback(&self) -> bool {
        self.fallback.is_some()
    }

    /// POSTs `event` of `order` for job `job_id` to the configured URL,
    /// signed with the configured secrets. A sender built by [`Self::for_endpoints`] has neither: that
    /// is a permanent error, since retrying cannot give it a URL.
    pub async fn deliver(
        &self,
        job_id: i64,
        order: &Order,
        event: &OrderEvent,
    ) -> Result<(), EffectError> {
        let fallback = self.fallback.as_ref().ok_or_else(|| {
            EffectError::permanent("this webhook sender has no URL of its own (no WEBHOOK_URL)")
        })?;
        self.deliver_to(&fallback.url, &fallback.secrets, job_id, order, event)
            .await
            .result
    }

    /// POSTs `event` of `order` for job `job_id` to `url`, signed with
    /// `secrets` (an endpoint's), and says what the attempt saw.
    pub async fn deliver_to(
        &self,
        url: &url::Url,
        secrets: &Secrets,
        job_id: i64,
        order: &Order,
        event: &OrderEvent,
    ) -> AttemptOutcome {
        match event_body(order, event) {
            Ok(body) => self.post_to(url, secrets, job_id, body).await,
            Err(e) => AttemptOutcome {
                status: None,
                excerpt: None,
                answer_sha256: None,
                duration: Duration::ZERO,
                result: Err(EffectError::permanent(format!(
                    "order {} does not serialize: {e}",
                    order.id
                ))),
            },
        }
    }

    /// POSTs `body` for job `job_id` to `url`, signed with `secrets`, and
    /// says what the attempt saw.
    pub async fn post_to(
        &self,
        url: &url::Url,
        secrets: &Secrets,
        job_id: i64,
        body: Vec<u8>,
    ) -> AttemptOutcome {
        let started = std::time::Instant::now();
        let mut outcome = AttemptOutcome {
            status: None,
            excerpt: None,
            answer_sha256: None,
            duration: Duration::ZERO,
            result: Ok(()),
        };
        outcome.result = self.send(url, secrets, job_id, body, &mut outcome).await;
        outcome.duration = started.elapsed();
        outcome
    }

    async fn send(
        &self,
        url: &url::Url,
        secrets: &Secrets,
        job_id: i64,
        body: Vec<u8>,
        seen: &mut AttemptOutcome,
    ) -> Result<(), EffectError> {
        if !self.allow_private {
            // reqwest resolves no literal address, so the resolver never sees it.
            guard::check_literal_host(url).map_err(EffectError::permanent)?;
            if self.proxied {
                // The proxy connects, so the resolver never sees the
                // receiver: every address its name has now must be public.
                // The proxy resolves it again, so a name whose owner changes
                // its answer in between is not covered (docs/security.md).
                let host = url.host_str().unwrap_or_default();
                let port = url.port_or_known_default().unwrap_or(443);
                guard::check_host(host, port)
                    .await
                    .map_err(EffectError::retryable)?;
            }
        }
        let id = idempotency_key(job_id);
        // This attempt's time, not the job's: receivers refuse stale timestamps.
        let timestamp = chrono::Utc::now().timestamp();
        let response = self
            .client
            .post(url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("Idempotency-Key", &id)
            .header("X-Signature", secrets.x_signature(&body))
            // The receiver continues the job's trace (W3C Trace Context).
            .headers(crate::trace_context::outgoing_headers())
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", secrets.sign_v1(&id, timestamp, &body))
            .body(body)
            .send()
            .await
            .map_err(|e| self.transport_error(url, e))?;

        let status = response.status();
        seen.status = Some(status.as_u16());
        if status.is_success() {
            let answer = read_body(response, true).await;
            seen.excerpt = Some(answer.excerpt);
            seen.answer_sha256 = answer.sha256;
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
            .map(|v| one_line(v, EXCERPT_CHARS));
        let answer = read_body(response, false).await;
        seen.excerpt = Some(answer.excerpt.clone());
        Err(classify(
            status,
            retry_after,
            location.as_deref(),
            &answer.excerpt,
        ))
    }

    /// `sha256=<hex HMAC-SHA256(body)>` with the configured secret; none for
    /// a sender without one.
    pub fn sign(&self, body: &[u8]) -> Option<String> {
        self.fallback.as_ref().map(|f| f.secrets.x_signature(body))
    }

    fn transport_error(&self, url: &url::Url, error: reqwest::Error) -> EffectError {
        // The URL may carry a token in its path or query: say only where it went.
        let error = error.without_url();
        let target = redacted(url);
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

/// The HTTP client of every call to the outside the service makes (webhook
/// deliveries, a provider's event log): no redirect followed, no proxy but
/// `config.proxy`, and, unless `config.allow_private`, no connection to a
/// loopback, private or link-local address.
pub fn guarded_client(config: &DeliveryOptions) -> anyhow::Result<reqwest::Client> {
    ensure_crypto_provider();
    let mut builder = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT.min(config.timeout))
        .timeout(config.timeout)
        .user_agent(USER_AGENT)
        // Following a redirect would hand the signed order to wherever the
        // Location points; a moved receiver is a configuration change.
        .redirect(reqwest::redirect::Policy::none())
        // HTTP_PROXY / HTTPS_PROXY / ALL_PROXY from the environment would
        // send every call to the proxy, whose address is all the
        // connect-time guard then sees: the receiver's private address
        // would go unchecked. Only WEBHOOK_PROXY, whose calls `send`
        // checks itself, is used.
        .no_proxy();
    if let Some(proxy) = &config.proxy {
        // The resolver would see the proxy's name only, and an
        // operator's proxy is often on a private network: the receiver
        // is checked in `send` instead.
        let proxy = reqwest::Proxy::all(proxy.as_str()).map_err(|e| {
            anyhow::anyhow!(
                "WEBHOOK_PROXY {}: {}",
                redacted_proxy(proxy.as_str()),
                e.without_url()
            )
        })?;
        builder = builder.proxy(proxy);
    } else if !config.allow_private {
        builder = builder.dns_resolver(guard::PublicOnlyResolver);
    }
    builder
        .build()
        .context("cannot build the webhook HTTP client")
}

/// What one attempt saw, for `delivery_attempts`.
#[derive(Debug)]
pub struct AttemptOutcome {
    /// The receiver's HTTP status; none when no answer came.
    pub status: Option<u16>,
    /// The start of the answer's body, bounded ([`EXCERPT_CHARS`]).
    pub excerpt: Option<String>,
    /// SHA-256 (hex) of the answer's body as read: its first
    /// [`MAX_ANSWER_BYTES`] bytes.
    pub answer_sha256: Option<String>,
    /// From the start of the call to the end of reading the answer.
    pub duration: Duration,
    pub result: Result<(), EffectError>,
}

/// Stable for a job across all its attempts, distinct between jobs.
pub fn idempotency_key(job_id: i64) -> String {
    format!("order-webhook-{job_id}")
}

/// reqwest is built with `rustls-no-provider` and panics when it builds a
/// client without a process-wide rustls crypto provider. Installs ring's,
/// unless the application installed one of its own first.
pub fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: one is installed either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Scheme, host and port only: paths and queries of webhook URLs often carry tokens.
fn redacted(url: &url::Url) -> String {
    url.origin().ascii_serialization()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> WebhookConfig {
        WebhookConfig {
            url: url::Url::parse("https://hooks.example.com/t/SECRET-PATH-TOKEN?k=v").expect("url"),
            secret: "s3cr3t-signing-key".to_owned(),
            timeout: Duration::from_secs(30),
            allow_private: false,
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
    fn the_signature_is_hex_hmac_sha256_of_the_body() {
        let sender = WebhookSender::new(&WebhookConfig {
            secret: "Jefe".to_owned(),
            ..config()
        })
        .expect("client builds");
        // RFC 4231, test case 2.
        assert_eq!(
            sender.sign(b"what do ya want for nothing?").as_deref(),
            Some("sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        );
    }

    #[test]
    fn delivery_options_print_without_the_proxy_login() {
        let options = DeliveryOptions {
            timeout: Duration::from_secs(1),
            allow_private: false,
            proxy: crate::config::parse_proxy("http://relay:hunter2@proxy.internal:3128").ok(),
        };
        assert!(!format!("{options:?}").contains("hunter2"));
    }
}
