//! Stripe's event log, read page by page: `GET {base}/v1/events` with the
//! source's API key, the events the shop acts on, from a creation time on.
//!
//! Stripe lists events newest first, at most 100 a page; `starting_after`
//! (the last id of a page) asks for the next, older page while `has_more`.
//! The client is built as webhook deliveries' is ([`guarded_client`]): no
//! redirects, no proxy from the environment, and no private address unless
//! `STRIPE_API_BASE` itself is a loopback one.

use std::fmt;
use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use reqwest::header::RETRY_AFTER;
use serde_json::Value;

use crate::config::{is_loopback, parse_api_base};
use crate::effects::webhook::guard::check_literal_host;
use crate::effects::webhook::{DeliveryOptions, guarded_client, parse_retry_after};
use crate::text::one_line;

/// The event types [`crate::inbox::event::interpret`] acts on for a `stripe`
/// source: the only ones asked for (`types[]`).
pub const HANDLED_TYPES: [&str; 3] = [
    "payment_intent.succeeded",
    "checkout.session.completed",
    "charge.refunded",
];

/// Events a page holds at most: Stripe's largest `limit`.
pub const PAGE_LIMIT: usize = 100;

/// Bytes of one page read at most: a hundred events are far smaller; an
/// answer without end is cut off, not buffered.
const MAX_PAGE_BYTES: usize = 8 * 1024 * 1024;

/// Characters of an error answer kept in the error.
const MAX_ERROR_CHARS: usize = 300;

/// One call's whole time: connect, send, read a page.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a 429, a 5xx or a failed connection is tried again, and how
/// long between tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries of one page in all, the first included.
    pub attempts: u32,
    /// The wait before the first retry; each next one doubles.
    pub base: Duration,
    /// The longest wait, a `Retry-After` included.
    pub max_wait: Duration,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            attempts: 4,
            base: Duration::from_millis(500),
            max_wait: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The wait after failed try `attempt` (1-based): what the answer asked
    /// for, or the doubling backoff with jitter, never above `max_wait`.
    fn wait(&self, attempt: u32, asked: Option<Duration>) -> Duration {
        let backoff = self
            .base
            .saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1)));
        let jitter = backoff.mul_f64(fastrand::f64() * 0.25);
        asked.unwrap_or(backoff + jitter).min(self.max_wait)
    }
}

/// Why a page could not be read. Never carries the key.
#[derive(Debug, thiserror::Error)]
pub enum StripeError {
    #[error(
        "stripe refused the API key of source {name:?} (401: {message}); give it a valid \
         key with `outbox-relay sources set-api-key {name} --api-key-file PATH`"
    )]
    KeyRefused { name: String, message: String },
    #[error(
        "stripe refused source {name:?} access to its events (403: {message}); its key needs \
         read access to events"
    )]
    Forbidden { name: String, message: String },
    #[error("stripe answered {status} to source {name:?}'s events request: {message}")]
    Refused {
        name: String,
        status: u16,
        message: String,
    },
    #[error("stripe's event log is unavailable to source {name:?} after {attempts} tries: {last}")]
    Unavailable {
        name: String,
        attempts: u32,
        last: String,
    },
    #[error("stripe's answer to source {name:?} is not an event list: {why}")]
    Malformed { name: String, why: String },
}

/// One page of the log: its events, newest first, and whether older ones follow.
#[derive(Debug, Clone)]
pub struct EventPage {
    pub events: Vec<ListedEvent>,
    pub has_more: bool,
}

/// An event as the log lists it: the whole event, as a webhook carries it.
#[derive(Debug, Clone)]
pub struct ListedEvent {
    pub id: String,
    /// Unix seconds.
    pub created: i64,
    pub payload: Value,
}

/// Reads Stripe's event log over one pooled client.
#[derive(Clone)]
pub struct StripeEvents {
    client: reqwest::Client,
    events_url: url::Url,
    retry: RetryPolicy,
}

impl fmt::Debug for StripeEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StripeEvents")
            .field("events_url", &self.events_url.as_str())
            .field("retry", &self.retry)
            .finish()
    }
}

impl StripeEvents {
    /// A reader of the log at `base` (checked by [`parse_api_base`]).
    pub fn new(base: &url::Url, retry: RetryPolicy) -> anyhow::Result<StripeEvents> {
        let base = parse_api_base(base.as_str()).map_err(anyhow::Error::msg)?;
        let loopback = is_loopback(&base);
        if !loopback {
            // reqwest resolves no literal address, so the resolver never sees it.
            check_literal_host(&base).map_err(anyhow::Error::msg)?;
        }
        let client = guarded_client(&DeliveryOptions {
            timeout: CALL_TIMEOUT,
            allow_private: loopback,
            proxy: None,
        })?;
        let mut events_url = base;
        let path = format!("{}/v1/events", events_url.path().trim_end_matches('/'));
        events_url.set_path(&path);
        Ok(StripeEvents {
            client,
            events_url,
            retry,
        })
    }

    /// The page of events created at `created_gte` or later, after event
    /// `starting_after` (the previous page's last), for `source` with `key`.
    /// A 429, a 5xx or a failed connection is tried again by the policy.
    pub async fn page(
        &self,
        source: &str,
        key: &str,
        created_gte: i64,
        starting_after: Option<&str>,
    ) -> Result<EventPage, StripeError> {
        let mut query: Vec<(&str, String)> = vec![
            ("limit", PAGE_LIMIT.to_string()),
            ("created[gte]", created_gte.to_string()),
        ];
        query.extend(HANDLED_TYPES.iter().map(|t| ("types[]", (*t).to_owned())));
        if let Some(after) = starting_after {
            query.push(("starting_after", after.to_owned()));
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (last, asked) = match self.call(source, key, &query).await? {
                Call::Page(page) => return Ok(page),
                Call::Again { why, retry_after } => (why, retry_after),
            };
            if attempt >= self.retry.attempts {
                return Err(StripeError::Unavailable {
                    name: source.to_owned(),
                    attempts: attempt,
                    last,
                });
            }
            let wait = self.retry.wait(attempt, asked);
            tracing::info!(
                source,
                attempt,
                wait = %humantime::format_duration(wait),
                reason = %last,
                "stripe's event log did not answer; trying again"
            );
            tokio::time::sleep(wait).await;
        }
    }

    async fn call(
        &self,
        source: &str,
        key: &str,
        query: &[(&str, String)],
    ) -> Result<Call, StripeError> {
        let mut url = self.events_url.clone();
        url.query_pairs_mut().extend_pairs(query);
        let response = match self.client.get(url).bearer_auth(key).send().await {
            Ok(response) => response,
            Err(error) => {
                return Ok(Call::Again {
                    why: crate::effects::error_chain(&error.without_url()),
                    retry_after: None,
                });
            }
        };
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        let body = match read_capped(response).await {
            Ok(body) => body,
            // A connection that dropped mid-answer is the network, like a
            // failed connection: asked again. A page over the cap is not.
            Err(Unread::BrokeOff(why)) => {
                return Ok(Call::Again {
                    why,
                    retry_after: None,
                });
            }
            Err(Unread::TooLarge(why)) if status.is_success() => {
                return Err(StripeError::Malformed {
                    name: source.to_owned(),
                    why,
                });
            }
            Err(Unread::TooLarge(why)) => why.into_bytes(),
        };
        if status.is_success() {
            return parse_page(&body)
                .map(Call::Page)
                .map_err(|why| StripeError::Malformed {
                    name: source.to_owned(),
                    why,
                });
        }
        let message = error_message(&body);
        match status {
            StatusCode::TOO_MANY_REQUESTS => Ok(Call::Again {
                why: format!("429 (rate limited): {message}"),
                retry_after,
            }),
            s if s.is_server_error() => Ok(Call::Again {
                why: format!("{}: {message}", s.as_u16()),
                retry_after,
            }),
            StatusCode::UNAUTHORIZED => Err(StripeError::KeyRefused {
                name: source.to_owned(),
                message,
            }),
            StatusCode::FORBIDDEN => Err(StripeError::Forbidden {
                name: source.to_owned(),
                message,
            }),
            s => Err(StripeError::Refused {
                name: source.to_owned(),
                status: s.as_u16(),
                message,
            }),
        }
    }
}

enum Call {
    Page(EventPage),
    Again {
        why: String,
        retry_after: Option<Duration>,
    },
}

/// Why an answer's body was not read whole.
enum Unread {
    TooLarge(String),
    BrokeOff(String),
}

/// The body, at most [`MAX_PAGE_BYTES`]; a longer one is an error, not a
/// truncated page.
async fn read_capped(mut response: reqwest::Response) -> Result<Vec<u8>, Unread> {
    let mut bytes = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if bytes.len() + chunk.len() > MAX_PAGE_BYTES {
                    return Err(Unread::TooLarge(format!(
                        "the answer is larger than {} MiB",
                        MAX_PAGE_BYTES / (1024 * 1024)
                    )));
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(bytes),
            Err(error) => {
                return Err(Unread::BrokeOff(format!(
                    "the answer broke off: {}",
                    error.without_url()
                )));
            }
        }
    }
}

/// Stripe's `{"error":{"message":…}}`, or the start of whatever came.
fn error_message(body: &[u8]) -> String {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    match parsed.as_ref().and_then(|v| v["error"]["message"].as_str()) {
        Some(message) => one_line(message, MAX_ERROR_CHARS),
        None if body.is_empty() => "(an empty body)".to_owned(),
        None => one_line(&String::from_utf8_lossy(body), MAX_ERROR_CHARS),
    }
}

/// A list object: `{"object":"list","data":[event…],"has_more":bool}`.
pub fn parse_page(body: &[u8]) -> Result<EventPage, String> {
    let list: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    if list["object"].as_str() != Some("list") {
        return Err("its \"object\" is not \"list\"".into());
    }
    let has_more = list["has_more"]
        .as_bool()
        .ok_or("it has no boolean \"has_more\"")?;
    let Value::Array(data) = &list["data"] else {
        return Err("it has no \"data\" array".into());
    };
    if data.len() > PAGE_LIMIT {
        return Err(format!(
            "{} events on a page of at most {PAGE_LIMIT}",
            data.len()
        ));
    }
    let events = data
        .iter()
        .enumerate()
        .map(|(i, event)| {
            let id = event["id"].as_str().filter(|id| !id.is_empty());
            let created = event["created"].as_i64();
            match (id, created) {
                (Some(id), Some(created)) => Ok(ListedEvent {
                    id: id.to_owned(),
                    created,
                    payload: event.clone(),
                }),
                _ => Err(format!(
                    "event {i} of the page has no \"id\" or \"created\""
                )),
            }
        })
        .collect::<Result<Vec<_>, String>>()?;
    if has_more && events.is_empty() {
        return Err("an empty page says more follow".into());
    }
    Ok(EventPage { events, has_more })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_object_is_read_and_anything_else_refused() {
        let page = parse_page(
            br#"{"object":"list","url":"/v1/events","has_more":true,
                 "data":[{"id":"evt_2","object":"event","created":20,"type":"charge.refunded"},
                         {"id":"evt_1","object":"event","created":10,"type":"charge.refunded"}]}"#,
        )
        .expect("a page");
        assert!(page.has_more);
        let ids: Vec<&str> = page.events.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, ["evt_2", "evt_1"]);
        assert_eq!(page.events[1].created, 10);
        assert!(parse_page(br#"{"object":"event"}"#).is_err());
        assert!(
            parse_page(br#"{"object":"list","data":[{"id":"evt_1"}],"has_more":false}"#).is_err()
        );
        assert!(parse_page(br#"{"object":"list","data":[],"has_more":true}"#).is_err());
        assert!(parse_page(b"<html>").is_err());
    }

    #[test]
    fn a_retry_waits_what_was_asked_and_never_longer_than_the_cap() {
        let policy = RetryPolicy::default();
        assert_eq!(
            policy.wait(1, Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
        assert_eq!(
            policy.wait(1, Some(Duration::from_secs(3600))),
            policy.max_wait
        );
        let second = policy.wait(2, None);
        assert!(second >= Duration::from_secs(1) && second <= Duration::from_millis(1250));
    }
}
