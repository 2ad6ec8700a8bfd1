-- Logs the publish attempts of a batch of outcomes, one row per attempt,
-- from $1, a JSON array of rows (effects/nats/attempt_log.rs), each an
-- array in the column order below, `started_at` in microseconds since the
-- epoch. Runs in the transaction that records those outcomes, with only the
-- rows of the claims the core's fenced finish matched, so each attempt is
-- logged exactly when its outcome is; one statement for the batch, not one
-- per job.
--
-- Index: none read; delivery_attempts has no unique key beside its identity,
-- so nothing here can conflict with another writer.
INSERT INTO delivery_attempts (job_id, endpoint_id, attempt, started_at, duration_ms,
                               status_code, outcome, excerpt, stream_sequence)
SELECT (r ->> 0)::bigint, (r ->> 1)::bigint, (r ->> 2)::integer,
       to_timestamp(0) + (r ->> 3)::bigint * interval '1 microsecond',
       (r ->> 4)::integer, (r ->> 5)::smallint, r ->> 6, r ->> 7, (r ->> 8)::bigint
FROM jsonb_array_elements($1) AS r
