//! A real HTTP server standing in for a webhook receiver: it records every
//! request and answers from a script (requests matching a rule first, then
//! any request), then with a default answer. With a spool directory, each
//! request is also written there as JSON: method, path, headers, body, the
//! answer given and, when the sink knows the secret, whether the signatures
//! (`X-Signature` and the Standard Webhooks `webhook-signature`) check out.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};

use order_service::effects::signature::Secrets;

/// Path of [`WebhookSink::url`].
pub const PATH: &str = "/hooks/orders";

/// How the sink answers one request.
#[derive(Debug, Clone)]
pub enum Answer {
    Reply {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: String,
    },
    /// Waits this long before answering 200: longer than the client's timeout.
    Hang(Duration),
}

impl Answer {
    pub fn status(status: u16) -> Answer {
        Answer::Reply {
            status,
            headers: Vec::new(),
            body: String::new(),
        }
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Answer {
        if let Answer::Reply { headers, .. } = &mut self {
            headers.push((name, value.into()));
        }
        self
    }

    pub fn body(mut self, text: impl Into<String>) -> Answer {
        if let Answer::Reply { body, .. } = &mut self {
            *body = text.into();
        }
        self
    }

    fn status_code(&self) -> u16 {
        match self {
            Answer::Reply { status, .. } => *status,
            Answer::Hang(_) => 200,
        }
    }
}

/// One request as the sink received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub at: DateTime<Utc>,
    pub method: Method,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The status the sink answered (or, for a hang, would have answered).
    pub answered: u16,
    /// `Some(true)` when both `X-Signature` and `webhook-signature` (with
    /// `webhook-id` and a fresh `webhook-timestamp`) verify with the secret
    /// the sink was given; `None` when it was given none.
    pub signature_valid: Option<bool>,
    /// The JSON file it was written to, when the sink has a spool directory.
    pub saved_as: Option<PathBuf>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Whether both signatures verify with `secrets` (someone else's key,
    /// say), as a receiver holding them would check them now.
    pub fn verifies_with(&self, secrets: &Secrets) -> bool {
        signatures_valid(secrets, &self.headers, &self.body, Utc::now().timestamp())
    }
}

type Matcher = Box<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// Answers for the requests whose body `matches`, in order, before the general script.
struct Rule {
    matches: Matcher,
    answers: VecDeque<Answer>,
}

struct Script {
    rules: Vec<Rule>,
    next: VecDeque<Answer>,
    then: Answer,
    secrets: Option<Secrets>,
    spool: Option<PathBuf>,
    saved: u64,
    requests: Vec<Recorded>,
    /// Calls whose answer has not been written yet, and the most there ever were.
    open: usize,
    most_open: usize,
}

#[derive(Clone)]
struct Shared(Arc<Mutex<Script>>);

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Script> {
        // Critical sections only push and pop; a poisoned lock is still consistent.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The running server, on a loopback port of its own; stops when dropped.
pub struct WebhookSink {
    addr: SocketAddr,
    script: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for WebhookSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookSink")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl WebhookSink {
    /// Listens on `127.0.0.1` on a free port; answers with `script` in order,
    /// then with `then` forever. With `spool`, every request is also written
    /// there as `NNNN-<idempotency key>-<status>.json`.
    pub async fn start(
        script: impl IntoIterator<Item = Answer>,
        then: Answer,
        spool: Option<PathBuf>,
    ) -> std::io::Result<WebhookSink> {
        let script = Shared(Arc::new(Mutex::new(Script {
            rules: Vec::new(),
            next: script.into_iter().collect(),
            then,
            secrets: None,
            spool,
            saved: 0,
            requests: Vec::new(),
            open: 0,
            most_open: 0,
        })));
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                tracing::warn!(error = %error, "webhook sink stopped");
            }
        });
        Ok(WebhookSink { addr, script, task })
    }

    /// `http://127.0.0.1:{port}/hooks/orders`.
    pub fn url(&self) -> url::Url {
        url::Url::parse(&format!("http://{}{PATH}", self.addr))
            .expect("a socket address and a fixed path make a valid URL")
    }

    /// Checks each request's signatures with `secret` (a `WEBHOOK_SECRET`
    /// value). One the sender could not use either leaves requests unchecked.
    pub fn verify_signatures_with(&self, secret: &str) {
        self.script.lock().secrets = Secrets::parse(secret).ok();
    }

    /// Requests whose body satisfies `matches` get `answers`, in order, before
    /// the general script applies to them (e.g. one order's webhook fails twice).
    pub fn answer_matching_with(
        &self,
        matches: impl Fn(&[u8]) -> bool + Send + Sync + 'static,
        answers: impl IntoIterator<Item = Answer>,
    ) {
        self.script.lock().rules.push(Rule {
            matches: Box::new(matches),
            answers: answers.into_iter().collect(),
        });
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.script.lock().requests.clone()
    }

    /// The most calls this receiver had open at once: received, not yet
    /// answered (a hang counts until it answers or the caller hangs up).
    pub fn most_open(&self) -> usize {
        self.script.lock().most_open
    }
}

/// One open call, counted from its arrival until its answer is handed back or
/// its caller goes away (the handler's future is then dropped).
struct OpenCall(Shared);

impl OpenCall {
    fn begin(script: &Shared) -> OpenCall {
        let mut locked = script.lock();
        locked.open += 1;
        locked.most_open = locked.most_open.max(locked.open);
        OpenCall(script.clone())
    }
}

impl Drop for OpenCall {
    fn drop(&mut self) {
        let mut locked = self.0.lock();
        locked.open = locked.open.saturating_sub(1);
    }
}

impl Drop for WebhookSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(
    State(script): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let _open = OpenCall::begin(&script);
    let (answer, mut recorded, spool) = {
        let mut script = script.lock();
        let ruled = script
            .rules
            .iter_mut()
            .find(|rule| !rule.answers.is_empty() && (rule.matches)(&body))
            .and_then(|rule| rule.answers.pop_front());
        let answer = ruled
            .or_else(|| script.next.pop_front())
            .unwrap_or_else(|| script.then.clone());
        let signature_valid = script
            .secrets
            .as_ref()
            .map(|secrets| signatures_valid(secrets, &headers, &body, Utc::now().timestamp()));
        let spool = script.spool.clone().map(|dir| {
            script.saved += 1;
            (dir, script.saved)
        });
        let recorded = Recorded {
            at: Utc::now(),
            method,
            path: uri.path().to_owned(),
            headers,
            body,
            answered: answer.status_code(),
            signature_valid,
            saved_as: None,
        };
        (answer, recorded, spool)
    };
    let answer = match spool {
        Some((dir, n)) => {
            let key = recorded.header("idempotency-key").unwrap_or("request");
            let name = format!(
                "{n:04}-{}-{}.json",
                super::file_stem(key),
                recorded.answered
            );
            match super::save(&dir, &name, to_json(&recorded)).await {
                Ok(path) => {
                    recorded.saved_as = Some(path);
                    answer
                }
                Err(error) => {
                    tracing::warn!(dir = %dir.display(), error = %error, "webhook sink: cannot save a request");
                    recorded.answered = 500;
                    Answer::status(500).body(format!("the sink cannot save the request: {error}"))
                }
            }
        }
        None => answer,
    };
    script.lock().requests.push(recorded);
    respond(answer).await
}

/// Whether a receiver that knows `secrets` accepts the request: its
/// `X-Signature` and its Standard Webhooks signature both verify.
fn signatures_valid(secrets: &Secrets, headers: &HeaderMap, body: &[u8], now: i64) -> bool {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let x_signature = header("x-signature").is_some_and(|h| secrets.verify_x_signature(body, h));
    let standard = match (
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
    ) {
        (Some(id), Some(timestamp), Some(signature)) => {
            secrets.verify(id, timestamp, body, signature, now)
        }
        _ => false,
    };
    x_signature && standard
}

async fn respond(answer: Answer) -> Response {
    match answer {
        Answer::Hang(wait) => {
            tokio::time::sleep(wait).await;
            StatusCode::OK.into_response()
        }
        Answer::Reply {
            status,
            headers,
            body,
        } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut response = (status, body).into_response();
            for (name, value) in headers {
                if let (Ok(name), Ok(value)) = (
                    HeaderName::from_bytes(name.as_bytes()),
                    HeaderValue::from_str(&value),
                ) {
                    response.headers_mut().insert(name, value);
                }
            }
            response
        }
    }
}

/// The request as a person would like to read it, in the order it happened
/// (received, headers, body, answer); the body as JSON when it is JSON, as
/// text otherwise.
fn to_json(request: &Recorded) -> Vec<u8> {
    let headers: serde_json::Map<String, serde_json::Value> = request
        .headers
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes())
                    .into_owned()
                    .into(),
            )
        })
        .collect();
    let body = serde_json::from_slice::<serde_json::Value>(&request.body)
        .unwrap_or_else(|_| String::from_utf8_lossy(&request.body).into_owned().into());
    // serde_json's maps sort their keys; the fields are written one by one to
    // keep a reading order.
    let fields: [(&str, serde_json::Value); 7] = [
        ("received_at", request.at.to_rfc3339().into()),
        ("method", request.method.as_str().into()),
        ("path", request.path.clone().into()),
        ("headers", headers.into()),
        ("body", body),
        ("answered", request.answered.into()),
        ("signature_valid", request.signature_valid.into()),
    ];
    let mut text = String::from("{\n");
    for (i, (name, value)) in fields.iter().enumerate() {
        let value = serde_json::to_string_pretty(value)
            .unwrap_or_else(|_| "null".to_owned())
            .replace('\n', "\n  ");
        let comma = if i + 1 < fields.len() { "," } else { "" };
        text.push_str(&format!("  {name:?}: {value}{comma}\n"));
    }
    text.push_str("}\n");
    text.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_valid_only_when_both_signatures_verify() {
        let secrets = Secrets::parse("demo-secret").unwrap_or_else(|e| panic!("{e}"));
        let body = br#"{"event":"order.placed"}"#;
        let now = 1_700_000_000;
        let mut headers = HeaderMap::new();
        let mut set = |name: &'static str, value: String| {
            headers.insert(
                name,
                HeaderValue::from_str(&value).unwrap_or_else(|e| panic!("{e}")),
            );
        };
        set("x-signature", secrets.x_signature(body));
        set("webhook-id", "order-webhook-1".to_owned());
        set("webhook-timestamp", now.to_string());
        set(
            "webhook-signature",
            secrets.sign_v1("order-webhook-1", now, body),
        );
        assert!(signatures_valid(&secrets, &headers, body, now));
        assert!(!signatures_valid(&secrets, &headers, b"{}", now));
        let mut old_only = headers.clone();
        old_only.remove("webhook-signature");
        assert!(!signatures_valid(&secrets, &old_only, body, now));
        let mut new_only = headers;
        new_only.remove("x-signature");
        assert!(!signatures_valid(&secrets, &new_only, body, now));
    }

    #[test]
    fn a_saved_request_is_json_in_reading_order() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "idempotency-key",
            HeaderValue::from_static("order-webhook-3"),
        );
        let request = Recorded {
            at: Utc::now(),
            method: Method::POST,
            path: PATH.to_owned(),
            headers,
            body: Bytes::from_static(br#"{"event":"order.placed","order":{"id":1,"customer_name":"\u0410\u043d\u043d\u0430"}}"#),
            answered: 500,
            signature_valid: Some(true),
            saved_as: None,
        };
        let text = String::from_utf8(to_json(&request)).unwrap_or_default();
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(parsed["body"]["order"]["customer_name"], "Анна", "{text}");
        assert_eq!(parsed["headers"]["idempotency-key"], "order-webhook-3");
        assert_eq!(parsed["answered"], 500);
        let at = |key: &str| text.find(&format!("\"{key}\"")).unwrap_or(usize::MAX);
        assert!(at("received_at") < at("headers") && at("headers") < at("body"));
        assert!(at("body") < at("answered"), "{text}");
    }
}
