//! A real HTTP server on port 0 standing in for a webhook receiver: it records
//! every request and answers from a script, then with a default answer.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};

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
}

/// One request as the sink received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub at: DateTime<Utc>,
    pub method: Method,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("request body is JSON")
    }
}

#[derive(Debug)]
struct Script {
    next: VecDeque<Answer>,
    then: Answer,
    requests: Vec<Recorded>,
}

type Shared = Arc<Mutex<Script>>;

/// The running server; stops when dropped.
#[derive(Debug)]
pub struct HttpSink {
    addr: SocketAddr,
    script: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl HttpSink {
    /// Answers with `script` in order, then with `then` forever.
    pub async fn start(script: impl IntoIterator<Item = Answer>, then: Answer) -> HttpSink {
        let script: Shared = Arc::new(Mutex::new(Script {
            next: script.into_iter().collect(),
            then,
            requests: Vec::new(),
        }));
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&script));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the HTTP sink");
        let addr = listener.local_addr().expect("sink address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        HttpSink { addr, script, task }
    }

    pub fn url(&self) -> url::Url {
        url::Url::parse(&format!("http://{}/hooks/orders", self.addr)).expect("sink URL")
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.script.lock().expect("sink state").requests.clone()
    }
}

impl Drop for HttpSink {
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
    let answer = {
        let mut script = script.lock().expect("sink state");
        script.requests.push(Recorded {
            at: Utc::now(),
            method,
            path: uri.path().to_owned(),
            headers,
            body,
        });
        let then = script.then.clone();
        script.next.pop_front().unwrap_or(then)
    };
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
            let mut response = (
                StatusCode::from_u16(status).expect("scripted status is valid"),
                body,
            )
                .into_response();
            for (name, value) in headers {
                response
                    .headers_mut()
                    .insert(name, value.parse().expect("scripted header value"));
            }
            response
        }
    }
}
