-- The W3C trace context of the request (or library caller's span) that
-- enqueued the job: {"traceparent": "00-<trace id>-<span id>-<flags>",
-- "tracestate": "..."}. The relay makes its span for the job a child of it, so
-- one trace runs from POST /orders to the webhook receiver. NULL for jobs
-- enqueued with no trace (old rows, callers without OpenTelemetry).
-- Adding a nullable column with no default rewrites nothing: instant on a big table.
ALTER TABLE jobs ADD COLUMN trace_context jsonb NULL;
