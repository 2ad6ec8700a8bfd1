//! A local stand-in for Stripe's event log, `GET /v1/events`, speaking its
//! wire format: a list object (`{"object":"list","data":[…],"has_more",
//! "url"}`), newest first, `limit` (1 to 100, 10 by default),
//! `starting_after` paging, `created[gte]` and `types[]` filters, Bearer
//! authentication answered 401 as Stripe answers it. The demo reconciles
//! against it, the bench measures against it, and the tests script it to
//! refuse, throttle or fail.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// Stripe's default page size, and its largest.
const DEFAULT_LIMIT: usize = 10;
const MAX_LIMIT: usize = 100;

/// A request the log answered, as it read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedRequest {
    pub limit: usize,
    pub created_gte: Option<i64>,
    pub types: Vec<String>,
    pub starting_after: Option<String>,
    /// What it answered.
    pub status: u16,
    /// How many events it listed.
    pub listed: usize,
}

#[derive(Debug, Default)]
struct Log {
    api_key: String,
    events: Vec<Value>,
    /// Answers (status, Retry-After seconds) given before serving pages again.
    script: VecDeque<(u16, Option<u64>)>,
    requests: Vec<LoggedRequest>,
}

type Shared = Arc<Mutex<Log>>;

fn lock(log: &Shared) -> std::sync::MutexGuard<'_, Log> {
    log.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The log, serving on 127.0.0.1 until dropped.
#[derive(Debug)]
pub struct StripeEventLog {
    addr: SocketAddr,
    log: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StripeEventLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StripeEventLog {
    /// A log that takes `api_key` as its only valid key, on a free port.
    pub async fn start(api_key: &str) -> std::io::Result<StripeEventLog> {
        let log: Shared = Arc::new(Mutex::new(Log {
            api_key: api_key.to_owned(),
            ..Log::default()
        }));
        let app = axum::Router::new()
            .route("/v1/events", axum::routing::get(list_events))
            .with_state(Arc::clone(&log));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                tracing::warn!(%error, "the Stripe event log stand-in stopped");
            }
        });
        Ok(StripeEventLog { addr, log, task })
    }

    /// What `STRIPE_API_BASE` is set to: `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> url::Url {
        url::Url::parse(&format!("http://{}", self.addr))
            .unwrap_or_else(|_| unreachable!("an address is a valid URL host"))
    }

    /// Adds an event to the log (any order: it lists newest first).
    pub fn add(&self, event: Value) {
        lock(&self.log).events.push(event);
    }

    /// The next request is answered `status` (with `Retry-After` seconds
    /// when given), in Stripe's error format, instead of a page; `200` is a
    /// page whose body breaks off half-way (the connection drops).
    pub fn answer_next(&self, status: u16, retry_after: Option<u64>) {
        lock(&self.log).script.push_back((status, retry_after));
    }

    /// Every request so far, oldest first.
    pub fn requests(&self) -> Vec<LoggedRequest> {
        lock(&self.log).requests.clone()
    }
}

/// A Stripe event of `event_type`, created at `created` (Unix seconds), in
/// test mode, around `object`.
pub fn stripe_event(id: &str, event_type: &str, created: i64, object: Value) -> Value {
    json!({
        "id": id,
        "object": "event",
        "api_version": "2024-06-20",
        "created": created,
        "livemode": false,
        "pending_webhooks": 0,
        "request": {"id": null, "idempotency_key": null},
        "type": event_type,
        "data": {"object": object},
    })
}

/// A `payment_intent.succeeded` of `amount` minor units of `currency` for
/// order `order_id`, under intent `intent`.
pub fn payment_succeeded(
    id: &str,
    created: i64,
    order_id: i64,
    amount: i64,
    currency: &str,
    intent: &str,
) -> Value {
    stripe_event(
        id,
        "payment_intent.succeeded",
        created,
        json!({"id": intent, "object": "payment_intent", "amount": amount,
               "amount_received": amount, "currency": currency, "status": "succeeded",
               "metadata": {"order_id": order_id.to_string()}}),
    )
}

/// A 200 whose body starts as a page and then fails: the server drops the
/// connection before the end, as a reset mid-answer does.
fn broken_page() -> Response {
    let chunks: [Result<&'static [u8], std::io::Error>; 2] = [
        Ok(b"{\"object\":\"list\",\"data\":[".as_slice()),
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "the connection dropped",
        )),
    ];
    let body = axum::body::Body::from_stream(futures_util::stream::iter(chunks));
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

fn stripe_error(status: StatusCode, kind: &str, message: &str) -> Response {
    (
        status,
        Json(json!({"error": {"type": kind, "message": message}})),
    )
        .into_response()
}

/// The parameters of a list request, as Stripe reads its form encoding.
#[derive(Default)]
struct ListParams {
    limit: Option<String>,
    created_gte: Option<String>,
    types: Vec<String>,
    starting_after: Option<String>,
}

fn params(query: Option<&str>) -> ListParams {
    let mut params = ListParams::default();
    for (name, value) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        let value = value.into_owned();
        match name.as_ref() {
            "limit" => params.limit = Some(value),
            "created[gte]" => params.created_gte = Some(value),
            "types[]" => params.types.push(value),
            "starting_after" => params.starting_after = Some(value),
            _ => {}
        }
    }
    params
}

async fn list_events(
    State(log): State<Shared>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let params = params(query.as_deref());
    let mut log = lock(&log);
    let mut logged = LoggedRequest {
        limit: 0,
        created_gte: params.created_gte.as_deref().and_then(|v| v.parse().ok()),
        types: params.types.clone(),
        starting_after: params.starting_after.clone(),
        status: 200,
        listed: 0,
    };
    let response = answer(&mut log, &headers, &params, &mut logged);
    logged.status = response.status().as_u16();
    log.requests.push(logged);
    response
}

fn answer(
    log: &mut Log,
    headers: &HeaderMap,
    params: &ListParams,
    logged: &mut LoggedRequest,
) -> Response {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if bearer != Some(log.api_key.as_str()) {
        return stripe_error(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "Invalid API Key provided",
        );
    }
    if let Some((status, retry_after)) = log.script.pop_front() {
        if status == 200 {
            return broken_page();
        }
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = stripe_error(status, "api_error", "scripted answer");
        if let Some(seconds) = retry_after
            && let Ok(value) = HeaderValue::from_str(&seconds.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        return response;
    }
    let limit = match params.limit.as_deref().map(str::parse::<usize>) {
        None => DEFAULT_LIMIT,
        Some(Ok(n)) if (1..=MAX_LIMIT).contains(&n) => n,
        Some(_) => {
            return stripe_error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "Invalid integer: limit must be between 1 and 100",
            );
        }
    };
    logged.limit = limit;
    let gte = match params.created_gte.as_deref().map(str::parse::<i64>) {
        None => i64::MIN,
        Some(Ok(gte)) => gte,
        Some(Err(_)) => {
            return stripe_error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "Invalid integer: created[gte]",
            );
        }
    };
    let mut matching: Vec<&Value> = log
        .events
        .iter()
        .filter(|e| e["created"].as_i64().is_some_and(|c| c >= gte))
        .filter(|e| {
            params.types.is_empty()
                || e["type"]
                    .as_str()
                    .is_some_and(|t| params.types.iter().any(|want| want == t))
        })
        .collect();
    // Newest first; events of one second in a stable order.
    matching.sort_by(|a, b| {
        let key = |e: &Value| (e["created"].as_i64(), e["id"].as_str().map(str::to_owned));
        key(b).cmp(&key(a))
    });
    let start = match &params.starting_after {
        None => 0,
        Some(after) => match matching
            .iter()
            .position(|e| e["id"].as_str() == Some(after))
        {
            Some(at) => at + 1,
            None => {
                return stripe_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    &format!("No such event: '{after}'"),
                );
            }
        },
    };
    let rest = matching.get(start..).unwrap_or_default();
    let page: Vec<Value> = rest.iter().take(limit).map(|e| (*e).clone()).collect();
    logged.listed = page.len();
    Json(json!({
        "object": "list",
        "url": "/v1/events",
        "has_more": rest.len() > limit,
        "data": page,
    }))
    .into_response()
}
