-- The attempt log of deliveries: one row per attempt of an `order_webhook`
-- job, written by the worker after the call, whatever its outcome. It feeds
-- the endpoints' success rate, latency and breaker, and the dashboard's log.
-- No foreign keys: an attempt outlives its job (archived to jobs_done, then
-- pruned) and its endpoint (removed); `jobs prune` deletes old rows.
CREATE TABLE delivery_attempts (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id bigint NOT NULL,
    endpoint_id bigint NOT NULL,
    -- The job's attempt number (jobs.attempts at the claim).
    attempt integer NOT NULL,
    started_at timestamptz NOT NULL,
    duration_ms integer NOT NULL,
    -- The receiver's HTTP status; NULL when no answer came (see outcome).
    status_code smallint,
    -- ok, retryable or permanent: what the attempt meant for the job.
    outcome text NOT NULL,
    -- The start of the answer's body, or the error when there was no answer.
    excerpt text,
    CONSTRAINT delivery_attempts_outcome_valid CHECK (outcome IN ('ok', 'retryable', 'permanent')),
    CONSTRAINT delivery_attempts_excerpt_bounded CHECK (length(excerpt) <= 1000),
    CONSTRAINT delivery_attempts_duration_valid CHECK (duration_ms >= 0)
);

-- An endpoint's recent attempts (its log, success rate and p95), newest first.
CREATE INDEX delivery_attempts_endpoint_idx ON delivery_attempts (endpoint_id, started_at DESC, id DESC);
-- Retention (`jobs prune`) and a job's attempts.
CREATE INDEX delivery_attempts_started_idx ON delivery_attempts (started_at);
CREATE INDEX delivery_attempts_job_idx ON delivery_attempts (job_id);

COMMENT ON TABLE delivery_attempts IS
    'One row per delivery attempt to an endpoint; pruned by outbox-relay jobs prune.';
