//! order_publish: an order event published to a NATS JetStream stream,
//! exactly once per event.
//!
//! Each `(event, order)` pair has a subject of its own,
//! `<subject_prefix>.<event>.<order id>` (`orders.paid.42`), which receives
//! one message in its whole life. Every attempt publishes the same body with
//! the same `Nats-Msg-Id` and `Nats-Expected-Last-Subject-Sequence: 0`:
//!
//! | the stream answers                              | outcome                      |
//! | ----------------------------------------------- | ---------------------------- |
//! | a PubAck                                        | done                         |
//! | a PubAck with `duplicate` (inside the window)   | done: an earlier attempt got in |
//! | "wrong last sequence" (the subject has a message)| done: an earlier attempt got in, past the window |
//! | no PubAck in time, connection lost              | retryable, same id           |
//! | no responders, but the stream exists            | retryable (leader election)  |
//! | JetStream temporarily unavailable               | retryable                    |
//! | the stream deleted, or no longer capturing it   | retryable, until it is back  |
//! | permission refused                              | permanent                    |
//! | message over the stream's max_msg_size          | permanent                    |
//!
//! So a relay that crashed between the ack and writing `done` leaves no
//! second message, however late the retry comes: the stream refuses it. What
//! this does not cover: a message the stream itself removed (its `max_age`,
//! `max_msgs`, a purge) no longer blocks its subject, and a retry after that
//! publishes it again.
//!
//! [`connection`] keeps one connection per NATS server and credentials for
//! the whole relay; [`loader`] reads the orders and events of jobs running
//! together at once; [`stream`] checks (or creates) an endpoint's stream;
//! [`outcome`] reads what the server answered; [`attempt_log`] logs each
//! attempt in `delivery_attempts` with the job's outcome; [`worker`] is the
//! job's worker. The loader batches with `micro_batch`.

pub mod attempt_log;
pub mod connection;
pub mod loader;
mod micro_batch;
pub mod outcome;
pub mod stream;
pub mod worker;

use std::sync::OnceLock;
use std::time::Duration;

use async_nats::HeaderMap;

pub use self::connection::{NatsConnections, NatsCredentials};
pub use self::outcome::{ErrorClass, Published};
pub use self::worker::PublishWorker;
use super::EffectError;

/// Longest wait for the stream's PubAck; past it the attempt is retried with
/// the same `Nats-Msg-Id`, never assumed lost.
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);
/// A stream's `duplicate_window` may not be shorter (`endpoints add` refuses
/// it): within the window a repeated publish is answered `duplicate`, with
/// the original sequence, even if the message was removed since; past it only
/// the subject check stands between a repeat and a second message, and that
/// check is gone once retention removes the message. A minute covers a
/// timed-out publish ([`PUBLISH_TIMEOUT`]) and the first retries after it.
pub const MIN_DUPLICATE_WINDOW: Duration = Duration::from_secs(60);

/// What one publish carries.
#[derive(Debug, Clone)]
pub struct Publication<'a> {
    /// `<prefix>.<event>.<order id>`.
    pub subject: String,
    /// The delivery's `webhook-id`: stable across attempts.
    pub message_id: &'a str,
    /// The stream the subject must land in (`Nats-Expected-Stream`).
    pub stream: &'a str,
    pub traceparent: Option<String>,
    /// Shared, not copied, by each attempt's send.
    pub body: bytes::Bytes,
}

/// The subject of `event_type` (`order.paid`) of order `order_id` under
/// `prefix`: `orders.paid.42`. Event types outside `order.` keep their name.
pub fn subject(prefix: &str, event_type: &str, order_id: i64) -> String {
    let event = event_type.strip_prefix("order.").unwrap_or(event_type);
    format!("{prefix}.{event}.{order_id}")
}

/// The headers of a publication: dedupe inside the window (`Nats-Msg-Id`),
/// one message per subject for ever (`Nats-Expected-Last-Subject-Sequence: 0`),
/// the right stream (`Nats-Expected-Stream`), and the trace.
pub fn headers(publication: &Publication<'_>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("Nats-Msg-Id", publication.message_id);
    headers.insert("Nats-Expected-Last-Subject-Sequence", "0");
    headers.insert("Nats-Expected-Stream", publication.stream);
    headers.insert("content-type", "application/json");
    if let Some(traceparent) = &publication.traceparent {
        headers.insert("traceparent", traceparent.as_str());
    }
    headers
}

/// A publish that is done, and the stream and sequence its PubAck gave (none
/// when the stream refused it as already on its subject).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acked {
    pub published: Published,
    pub sequence: Option<u64>,
    pub stream: Option<String>,
}

/// Publishes `publication` over `connection` and reads the answer: done
/// only on the stream's PubAck (or its word that the subject has its message).
pub async fn classify_publish(
    connection: &connection::Connection,
    endpoint: &str,
    publication: &Publication<'_>,
) -> Result<Acked, EffectError> {
    let sent = connection
        .jetstream
        .publish_with_headers(
            publication.subject.clone(),
            headers(publication),
            publication.body.clone(),
        )
        .await;
    let acked = match sent {
        Ok(ack) => ack.await,
        Err(error) => Err(error),
    };
    match acked {
        Ok(ack) => Ok(Acked {
            published: if ack.duplicate {
                Published::Duplicate
            } else {
                Published::New
            },
            sequence: Some(ack.sequence),
            stream: Some(ack.stream),
        }),
        Err(error) => outcome::classify(error, connection, endpoint, publication)
            .await
            .map(|published| Acked {
                published,
                sequence: None,
                stream: None,
            }),
    }
}

/// One endpoint's counters, `outbox_nats_publishes_total{endpoint,outcome}`
/// and `outbox_nats_errors_total{endpoint,class}`, each registered the first
/// time it counts: a publish then counts with one atomic add, not a label
/// set built, hashed and looked up in the registry for it.
#[derive(Default)]
pub struct PublishCounters {
    endpoint: String,
    /// By [`Published`]: new, duplicate, already published.
    published: [OnceLock<metrics::Counter>; 3],
    /// By [`ErrorClass`]: retryable, permanent.
    errors: [OnceLock<metrics::Counter>; 2],
}

impl std::fmt::Debug for PublishCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublishCounters")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl PublishCounters {
    pub fn new(endpoint: &str) -> PublishCounters {
        PublishCounters {
            endpoint: endpoint.to_owned(),
            ..PublishCounters::default()
        }
    }

    /// Counts `result`.
    pub fn count(&self, result: &Result<Acked, EffectError>) {
        let counter = match result {
            Ok(Acked { published, .. }) => {
                let slot = match published {
                    Published::New => 0,
                    Published::Duplicate => 1,
                    Published::AlreadyPublished => 2,
                };
                self.published[slot].get_or_init(|| {
                    metrics::counter!(
                        "outbox_nats_publishes_total",
                        "endpoint" => self.endpoint.clone(),
                        "outcome" => published.as_str()
                    )
                })
            }
            Err(error) => {
                let class = ErrorClass::of(error);
                let slot = match class {
                    ErrorClass::Retryable => 0,
                    ErrorClass::Permanent => 1,
                };
                self.errors[slot].get_or_init(|| {
                    metrics::counter!(
                        "outbox_nats_errors_total",
                        "endpoint" => self.endpoint.clone(),
                        "class" => class.as_str()
                    )
                })
            }
        };
        counter.increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subject_drops_the_order_prefix_of_the_event() {
        assert_eq!(subject("orders", "order.paid", 42), "orders.paid.42");
        assert_eq!(subject("shop.eu", "order.placed", 7), "shop.eu.placed.7");
    }

    #[test]
    fn every_publication_expects_an_empty_subject_and_carries_its_id() {
        let publication = Publication {
            subject: "orders.paid.42".into(),
            message_id: "order-webhook-9",
            stream: "ORDERS",
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
            body: bytes::Bytes::from_static(b"{}"),
        };
        let headers = headers(&publication);
        let get = |name: &str| headers.get(name).map(ToString::to_string);
        assert_eq!(get("Nats-Msg-Id").as_deref(), Some("order-webhook-9"));
        assert_eq!(
            get("Nats-Expected-Last-Subject-Sequence").as_deref(),
            Some("0")
        );
        assert_eq!(get("Nats-Expected-Stream").as_deref(), Some("ORDERS"));
        assert!(get("traceparent").is_some());
    }
}
