//! The webhook receiver the tests talk to: the library's
//! (`outbox_relay::demo::sinks::webhook`, also the demo's), answering from a
//! script, then with a default answer; a panic instead of an error when it
//! cannot start, and `Recorded::json` for assertions.

use axum::body::Bytes;
use axum::http::{HeaderMap, Method};
use chrono::{DateTime, Utc};
use outbox_relay::demo::sinks::webhook::{self as sink, WebhookSink};

pub use outbox_relay::demo::sinks::webhook::Answer;

/// One request as the sink received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub at: DateTime<Utc>,
    pub method: Method,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl From<sink::Recorded> for Recorded {
    fn from(request: sink::Recorded) -> Recorded {
        Recorded {
            at: request.at,
            method: request.method,
            path: request.path,
            headers: request.headers,
            body: request.body,
        }
    }
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("request body is JSON")
    }
}

/// The running server on port 0; stops when dropped.
#[derive(Debug)]
pub struct HttpSink(WebhookSink);

impl HttpSink {
    /// Answers with `script` in order, then with `then` forever.
    pub async fn start(script: impl IntoIterator<Item = Answer>, then: Answer) -> HttpSink {
        HttpSink(
            WebhookSink::start(script, then, None)
                .await
                .expect("start the HTTP sink"),
        )
    }

    pub fn url(&self) -> url::Url {
        self.0.url()
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.0.requests().into_iter().map(Recorded::from).collect()
    }
}
