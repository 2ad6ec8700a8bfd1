//! The webhook receiver the tests talk to: the library's
//! (`outbox_dev_tools::demo::sinks::webhook`, also the demo's), answering from a
//! script, then with a default answer; a panic instead of an error when it
//! cannot start, and `Recorded::json` for assertions.

use outbox_dev_tools::demo::sinks::webhook::{self as sink, WebhookSink};

pub use outbox_dev_tools::demo::sinks::webhook::Answer;

/// One request as the sink received it: the library's record (fields and
/// `header` through `Deref`) with a JSON reader for assertions.
#[derive(Debug, Clone)]
pub struct Recorded(sink::Recorded);

impl std::ops::Deref for Recorded {
    type Target = sink::Recorded;

    fn deref(&self) -> &sink::Recorded {
        &self.0
    }
}

impl Recorded {
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

    /// Requests whose body satisfies `matches` get `answers` first, in order.
    pub fn answer_matching_with(
        &self,
        matches: impl Fn(&[u8]) -> bool + Send + Sync + 'static,
        answers: impl IntoIterator<Item = Answer>,
    ) {
        self.0.answer_matching_with(matches, answers);
    }

    /// Checks each request's signatures with `secret` (see `Recorded::signature_valid`).
    pub fn verify_signatures_with(&self, secret: &str) {
        self.0.verify_signatures_with(secret);
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.0.requests().into_iter().map(Recorded).collect()
    }

    /// The most calls this receiver had open at once.
    pub fn most_open(&self) -> usize {
        self.0.most_open()
    }
}
