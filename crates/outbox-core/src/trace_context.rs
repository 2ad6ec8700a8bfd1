//! W3C trace context across the outbox: captured from the enqueuing span,
//! stored with each job in `jobs.trace_context`, and adopted by the worker pool's
//! span for that job, so one trace runs from whoever enqueued to the effect.
//!
//! The context lives in OpenTelemetry's span data, which exists only when the
//! subscriber has `tracing-opentelemetry`'s layer (the application installs
//! it); without it every function here is a no-op.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The stored form: `{"traceparent": "00-…-…-01", "tracestate": "…"}`.
pub(crate) type StoredContext = serde_json::Value;

/// The context of `span`, as stored in `jobs.trace_context`; `None` when the
/// span carries none (disabled, or no OpenTelemetry layer).
pub(crate) fn capture(span: &tracing::Span) -> Option<StoredContext> {
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    serde_json::to_value(carrier).ok()
}

/// [`capture`] of the current span.
pub(crate) fn current() -> Option<StoredContext> {
    capture(&tracing::Span::current())
}

/// Makes `span` (just created, not yet entered) a child of a stored context,
/// and records its `trace_id`. A missing or malformed context leaves the
/// span a root of its own trace: a job is performed all the same.
pub(crate) fn continue_stored(span: &tracing::Span, stored: Option<&StoredContext>) {
    if let Some(fields) = stored.and_then(serde_json::Value::as_object) {
        let carrier: HashMap<String, String> = fields
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
            .collect();
        adopt(span, TraceContextPropagator::new().extract(&carrier));
    }
    record_trace_id(span);
}

/// Makes `span` (not yet entered) a child of `cx`, when `cx` holds a valid
/// span context; otherwise, or if the span is disabled or already entered,
/// leaves it as it is. [`continue_stored`] is this for a stored context.
pub(crate) fn adopt(span: &tracing::Span, cx: opentelemetry::Context) {
    if cx.span().span_context().is_valid() {
        // Fails only for a span already entered or disabled; it stays a root.
        let _ = span.set_parent(cx);
    }
}

/// Fills the span's (declared, empty) `trace_id` field, so that every log
/// line inside it names its trace.
pub(crate) fn record_trace_id(span: &tracing::Span) {
    let cx = span.context();
    let span_context = cx.span().span_context().clone();
    if span_context.is_valid() {
        span.record("trace_id", tracing::field::display(span_context.trace_id()));
    }
}
