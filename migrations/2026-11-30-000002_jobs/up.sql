-- The outbox. Every row is one effect to perform; the relay moves it through
-- pending -> processing -> done | failed (ARCHITECTURE.md, "The job state machine").
CREATE TABLE jobs (
    id               bigserial   PRIMARY KEY,
    -- NULL for jobs a library user enqueues without an order.
    order_id         bigint      NULL REFERENCES orders (id) ON DELETE SET NULL,
    kind             text        NOT NULL,
    payload          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    status           text        NOT NULL DEFAULT 'pending',
    -- A job is due once run_after <= now(); retries push it into the future.
    run_after        timestamptz NOT NULL DEFAULT now(),
    -- Incremented by every claim; together with locked_by it is the fencing token.
    attempts         int         NOT NULL DEFAULT 0,
    max_attempts     int         NOT NULL DEFAULT 8,
    locked_by        text        NULL,
    locked_at        timestamptz NULL,
    lease_expires_at timestamptz NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz NULL,
    last_error       text        NULL,
    CONSTRAINT jobs_status_valid CHECK (status IN ('pending', 'processing', 'done', 'failed')),
    CONSTRAINT jobs_attempts_not_negative CHECK (attempts >= 0),
    CONSTRAINT jobs_max_attempts_positive CHECK (max_attempts > 0),
    CONSTRAINT jobs_kind_not_empty CHECK (kind <> ''),
    -- A processing job always has an owner and a lease; the reaper relies on it.
    CONSTRAINT jobs_processing_has_lease CHECK (
        status <> 'processing' OR (locked_by IS NOT NULL AND lease_expires_at IS NOT NULL)
    )
);

-- The claim's index. Its key is exactly the claim's ORDER BY (run_after, id), so
-- the claim reads due rows in order and stops after LIMIT rows. Finished rows are
-- outside the partial index, so a table full of done jobs costs the claim nothing.
CREATE INDEX jobs_claim_idx ON jobs (run_after, id) WHERE status = 'pending';

-- The reaper's index: expired leases are found without touching any other row.
CREATE INDEX jobs_lease_idx ON jobs (lease_expires_at) WHERE status = 'processing';

-- GET /orders/{id} lists an order's jobs.
CREATE INDEX jobs_order_id_idx ON jobs (order_id);

-- `jobs prune` deletes done jobs by age in batches.
CREATE INDEX jobs_done_finished_at_idx ON jobs (finished_at) WHERE status = 'done';

-- `jobs retry --failed` and `jobs list --status failed`.
CREATE INDEX jobs_failed_idx ON jobs (id) WHERE status = 'failed';
