//! W3C trace context across the outbox: taken from a request's `traceparent`
//! (or started there), stored with each job in `jobs.trace_context`, adopted
//! by the relay's span for that job, and sent on with the job's effect.
//!
//! The context lives in OpenTelemetry's span data, which exists only when the
//! subscriber has `tracing-opentelemetry`'s layer ([`crate::telemetry`]
//! installs it); without it every function here is a no-op.

use std::collections::HashMap;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// Makes `span` (just created) a child of the caller's `traceparent` and
/// `tracestate` headers when they hold a valid context, and records its
/// `trace_id`. Without them, or with malformed ones, the span starts a trace.
/// (The queue core does the same for a job's stored context.)
pub fn continue_from_headers(span: &tracing::Span, headers: &HeaderMap) {
    let cx = TraceContextPropagator::new().extract(&opentelemetry_http::HeaderExtractor(headers));
    if cx.span().span_context().is_valid() {
        // Fails only for a span already entered or disabled; it stays a root.
        let _ = span.set_parent(cx);
    }
    let span_context = span.context().span().span_context().clone();
    if span_context.is_valid() {
        span.record("trace_id", tracing::field::display(span_context.trace_id()));
    }
}

/// `traceparent` (and `tracestate`) headers for an outgoing request made
/// inside the current span.
pub fn outgoing_headers() -> HeaderMap {
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(&tracing::Span::current().context(), &mut carrier);
    let mut headers = HeaderMap::new();
    for (name, value) in carrier {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
            headers.insert(name, value);
        }
    }
    headers
}

/// The current span's `traceparent`, for carriers that are not HTTP (the
/// confirmation email's header).
pub fn current_traceparent() -> Option<String> {
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(&tracing::Span::current().context(), &mut carrier);
    carrier.remove("traceparent")
}
