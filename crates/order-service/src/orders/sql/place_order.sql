-- Places an order in one statement: the order, its items, its `order.placed`
-- event and its jobs, with their concurrency keys' rows and, for an enqueuer
-- without a waker, their NOTIFY. Outside a transaction it is its own: no
-- BEGIN, no COMMIT, one round trip (orders/place.rs says why that counts).
-- A statement is all or nothing, so an error leaves no half-written order.
--
-- $1 … $7: the order's row ($7, the API key that placed it, is its first
-- event's too). $8 … $11: its items, one array per column, in the request's
-- order. $12: the event type. $13: the payment window in milliseconds
-- (ORDER_PAYMENT_WINDOW), NULL without one: `expires_at` is `created_at`
-- plus it, both this transaction's now().
-- $14: max_attempts as configured (JOB_MAX_ATTEMPTS); the jobs get at least
-- 1, as JobOptions does. $15: FANOUT_INLINE. $16: the trace context of every
-- job. $17: the NOTIFY channel, NULL when the enqueuer wakes the relays after
-- commit. $18 … $22: the kinds: confirmation, receipt, webhook, publish,
-- fan-out (the job types' own KIND).
--
-- Only the idempotency indexes can conflict (the id is a sequence's):
-- orders_idempotency_key_per_api_key and orders_idempotency_key_without_api_key,
-- partial indexes that an ON CONFLICT target could not name without their
-- predicate. On a conflict `new_order` is empty, so nothing else is written
-- (not even a job id drawn) and no row comes back.
--
-- The items are inserted in the request's order, so their ids ascend in
-- that order. Foreign keys (items, event, jobs to the order) are checked at
-- the end of the statement, once the order's row is there.
--
-- The jobs are the rows Enqueuer::enqueue_many wrote for the placement
-- (place::placement_jobs builds them; tests/it/placement_rows.rs compares
-- the two row by row): in `planned` order (n), ids drawn ahead so the
-- confirmation can name its receipt as parent (policy `run`), as
-- depend::assign_batch_ids draws them, ascending in enqueue order. Every
-- ordering key is new (named after this order, which no one else sees yet),
-- so a job is blocked only behind an earlier job of the batch with its key.
-- Keys: orders/mod.rs (email_key, webhook_key, fanout_key) and events.rs
-- (delivery_key, endpoint_key). Deliveries: events.rs's RecordedEvent::
-- deliveries: no endpoint at all, one unaddressed webhook for `default`;
-- more subscribers than $15, one `order_fanout` naming them as id runs
-- (jobs.rs's id_runs); else one delivery per endpoint, webhooks first.
--
-- The concurrency keys' rows: as ensure_concurrency_keys.sql (the core's)
-- writes them, and why: existing rows skipped by a plain read, which never
-- waits, ON CONFLICT DO NOTHING for a key created at the same moment.
WITH new_order AS (
    INSERT INTO orders (customer_email, customer_name, currency, total_cents,
                        idempotency_key, request_hash, api_key_id, expires_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, now() + $13::bigint * interval '1 millisecond')
    ON CONFLICT DO NOTHING
    RETURNING id, created_at, expires_at
), items AS (
    INSERT INTO order_items (order_id, sku, name, quantity, unit_price_cents)
    SELECT new_order.id, item.sku, item.name, item.quantity, item.unit_price_cents
    FROM new_order,
         unnest($8::text[], $9::text[], $10::int[], $11::bigint[])
             WITH ORDINALITY AS item (sku, name, quantity, unit_price_cents, n)
    ORDER BY item.n
    RETURNING id
), event AS (
    INSERT INTO order_events (order_id, seq, type, data, api_key_id)
    SELECT new_order.id, 1, $12, '{}'::jsonb, $7
    FROM new_order
    RETURNING id
), subscribers AS (
    -- The count and the id runs as event_type_subscribers keeps them (a
    -- migration computes them when the endpoints change), so that an order
    -- past FANOUT_INLINE costs the same however many endpoints there are.
    SELECT s.webhook_endpoints, s.nats_endpoints, s.any_endpoint,
           s.any_endpoint AND s.endpoint_count > $15::bigint AS fan_out,
           s.webhook_runs, s.nats_runs
    FROM order_event_subscribers($12) AS s
), planned AS (
    SELECT job.n, job.kind, job.payload, job.ordering_key, job.concurrency_key
    FROM new_order, event, subscribers AS s, LATERAL (
        SELECT 1 AS n, $18::text AS kind,
               jsonb_build_object('order_id', new_order.id, 'event_id', event.id) AS payload,
               'order-' || new_order.id || '-emails' AS ordering_key,
               NULL::text AS concurrency_key
        UNION ALL
        SELECT 2, $19::text, jsonb_build_object('order_id', new_order.id), NULL, NULL
        UNION ALL
        SELECT 3, $20::text, jsonb_build_object('order_id', new_order.id, 'event_id', event.id),
               'order-' || new_order.id || '-webhooks', NULL
        WHERE NOT s.any_endpoint
        UNION ALL
        SELECT 3, $22::text,
               jsonb_build_object(
                   'order_id', new_order.id, 'event_id', event.id, 'max_attempts', $14::int,
                   'webhook_endpoints', s.webhook_runs,
                   'nats_endpoints', s.nats_runs),
               'order-' || new_order.id || '-fanout', NULL
        WHERE s.fan_out
        UNION ALL
        SELECT 2 + w.n, $20::text,
               jsonb_build_object('order_id', new_order.id, 'event_id', event.id, 'endpoint_id', w.id),
               'endpoint:' || w.id || ':order:' || new_order.id, 'endpoint:' || w.id
        FROM unnest(s.webhook_endpoints) WITH ORDINALITY AS w (id, n)
        WHERE NOT s.fan_out
        UNION ALL
        SELECT 2 + cardinality(s.webhook_endpoints) + p.n, $21::text,
               jsonb_build_object('order_id', new_order.id, 'event_id', event.id, 'endpoint_id', p.id),
               'endpoint:' || p.id || ':order:' || new_order.id, 'endpoint:' || p.id
        FROM unnest(s.nats_endpoints) WITH ORDINALITY AS p (id, n)
        WHERE NOT s.fan_out
    ) AS job
), drawn AS (
    SELECT nextval(pg_get_serial_sequence('jobs', 'id')) AS id FROM planned
), job_ids AS (
    SELECT id, row_number() OVER (ORDER BY id) AS n FROM drawn
), concurrency_keys AS (
    INSERT INTO job_concurrency_keys (key)
    SELECT DISTINCT planned.concurrency_key FROM planned
    WHERE planned.concurrency_key IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM job_concurrency_keys AS c WHERE c.key = planned.concurrency_key)
    ORDER BY planned.concurrency_key
    ON CONFLICT (key) DO NOTHING
), written AS (
    INSERT INTO jobs (id, kind, payload, max_attempts, ordering_key, blocked, trace_context,
                      concurrency_key, waiting_on, depends_on, dependency_policy, has_dependents,
                      order_id)
    SELECT job_ids.id, planned.kind, planned.payload, greatest($14::int, 1), planned.ordering_key,
           planned.ordering_key IS NOT NULL
               AND row_number() OVER (PARTITION BY planned.ordering_key ORDER BY planned.n) > 1,
           $16::jsonb, planned.concurrency_key,
           CASE WHEN planned.n = 1 THEN ARRAY[receipt.id] ELSE '{}' END,
           CASE WHEN planned.n = 1 THEN ARRAY[receipt.id] END,
           CASE WHEN planned.n = 1 THEN 'run' END,
           -- The receipt has the email as its dependent; no other job has
           -- one (the finish looks for dependents only where this is not
           -- false).
           planned.n = 2,
           new_order.id
    FROM planned
    JOIN job_ids USING (n)
    CROSS JOIN new_order
    JOIN job_ids AS receipt ON receipt.n = 2
    RETURNING id, kind
), woken AS (
    SELECT pg_notify($17::text, kinds.kind)
    FROM (SELECT DISTINCT kind FROM planned ORDER BY kind) AS kinds
    WHERE $17::text IS NOT NULL
)
SELECT
    new_order.id AS order_id,
    new_order.created_at,
    new_order.expires_at,
    coalesce((SELECT array_agg(items.id ORDER BY items.id) FROM items), '{}') AS item_ids,
    event.id AS event_id,
    coalesce((SELECT array_agg(written.id ORDER BY written.id) FROM written), '{}') AS job_ids,
    coalesce((SELECT array_agg(written.kind ORDER BY written.id) FROM written), '{}') AS job_kinds,
    (SELECT count(*) FROM woken) AS notified
FROM new_order, event
