//! What wraps every request: its tracing span, its metrics, its time limit.

use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

/// The route template (`/orders/{id}`), never the raw path: a label per order
/// id would grow the metrics without bound. Requests no route matched share
/// one label for the same reason.
fn route_of(request: &Request) -> String {
    request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned())
}

/// Standard methods by name; anything else (clients may send any token) as
/// `other`, to keep the label set bounded.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// The span of one request (tower-http's `TraceLayer` enters it and logs the
/// response with its status and latency inside it): a child of the caller's
/// `traceparent` when it sent one, else the root of a new trace.
pub(crate) fn request_span(request: &Request) -> tracing::Span {
    let span = tracing::info_span!(
        "http_request",
        method = %request.method(),
        route = %route_of(request),
        path = %request.uri().path(),
        trace_id = tracing::field::Empty,
    );
    crate::trace_context::continue_from_headers(&span, request.headers());
    span
}

/// `http_requests_total` and `http_request_duration_seconds`, by method,
/// route and status.
pub(crate) async fn record_metrics(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = method_label(request.method());
    let route = route_of(&request);
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    let labels = [
        ("method", method.to_owned()),
        ("route", route),
        ("status", status),
    ];
    metrics::counter!("http_requests_total", &labels).increment(1);
    metrics::histogram!("http_request_duration_seconds", &labels)
        .record(started.elapsed().as_secs_f64());
    response
}

/// Answers 503 (JSON) when a request, body upload included, takes longer than
/// the limit. Dropping the handler's future abandons the request, but not a
/// database call already running on a blocking thread; see `ApiSettings`.
pub(crate) async fn enforce_timeout(
    State(limit): State<Duration>,
    request: Request,
    next: Next,
) -> Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::Timeout(limit).into_response(),
    }
}
