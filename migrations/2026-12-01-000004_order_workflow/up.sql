-- The order workflow: a status per order, the events that moved it, and
-- ordered delivery of the jobs that share an ordering key.

-- placed -> paid -> shipped -> delivered; placed or paid -> cancelled.
ALTER TABLE orders ADD COLUMN status text NOT NULL DEFAULT 'placed';
ALTER TABLE orders ADD CONSTRAINT orders_status_valid
    CHECK (status IN ('placed', 'paid', 'shipped', 'delivered', 'cancelled'));

-- One row per transition (and one for the placement). seq numbers an order's
-- events 1, 2, ... in commit order: a transition locks its order row first, so
-- two transitions of one order never number concurrently.
CREATE TABLE order_events (
    id               bigserial   PRIMARY KEY,
    order_id         bigint      NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    seq              int         NOT NULL,
    type             text        NOT NULL,
    data             jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- A transition's Idempotency-Key, stored with its event in the same
    -- transaction, so a retried request finds it.
    idempotency_key  text        NULL,
    request_hash     text        NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT order_events_seq_unique UNIQUE (order_id, seq),
    CONSTRAINT order_events_seq_positive CHECK (seq > 0),
    CONSTRAINT order_events_idempotency_key_unique UNIQUE (idempotency_key),
    CONSTRAINT order_events_type_valid CHECK (type IN (
        'order.placed', 'order.paid', 'order.shipped', 'order.delivered', 'order.cancelled'
    ))
);

-- Orders placed before this migration had one event: their placement.
INSERT INTO order_events (order_id, seq, type, created_at)
SELECT id, 1, 'order.placed', created_at FROM orders;

-- Ordered delivery. Jobs that share an ordering_key run one at a time, in id
-- (enqueue) order. `blocked` marks a job that has an earlier unfinished job
-- (pending, processing or failed) with its key: set at enqueue, cleared for the
-- next job when its predecessor ends done or cancelled. Blocked jobs are kept
-- out of the claim's indexes, so a key held up by a failed head costs the
-- claim nothing however many jobs wait behind it.
ALTER TABLE jobs ADD COLUMN ordering_key text NULL;
ALTER TABLE jobs ADD COLUMN blocked boolean NOT NULL DEFAULT false;
ALTER TABLE jobs ADD CONSTRAINT jobs_blocked_is_a_waiting_keyed_job
    CHECK (NOT blocked OR (status = 'pending' AND ordering_key IS NOT NULL));

DROP INDEX jobs_claim_idx;
CREATE INDEX jobs_claim_idx ON jobs (run_after, id) WHERE status = 'pending' AND NOT blocked;
DROP INDEX jobs_kind_claim_idx;
CREATE INDEX jobs_kind_claim_idx ON jobs (kind, run_after, id)
    WHERE status = 'pending' AND NOT blocked;

-- An ordering key's unfinished jobs in order: the enqueue finds the head to
-- wait behind, a finish finds the next job to release, `jobs blocked` counts
-- what waits. Finished jobs leave the index.
CREATE INDEX jobs_ordering_key_idx ON jobs (ordering_key, id)
    WHERE ordering_key IS NOT NULL AND status IN ('pending', 'processing', 'failed');
