-- A placement as one call of a function (crates/order-service/src/orders/
-- sql/place_order.sql calls it), where it was one statement of ten
-- common table expressions. Still one round trip and one statement, so
-- still all or nothing outside a transaction; inside, the same rows in the
-- same order. What changes is the server's work per order: each step below
-- is a plain statement whose plan PL/pgSQL keeps for the session, where the
-- single statement materialised every CTE, sorted and numbered its rows
-- with window functions and joined them by hash, for three to eighteen
-- rows. Through pgbench on this 2-core machine, each form wrapped in a
-- PL/pgSQL function so that both keep their plans, alternating: 1.12x to
-- 1.41x the statement's orders a second at 16 clients, and 0.25 to 0.27 ms
-- a call against 0.29 to 0.30 at one client with asynchronous commit
-- (docs/performance.md, "Placement as a function").
--
-- The parameters are the statement's $1 ... $22, in its order; what each
-- is, and the rules of the jobs, are in place_order.sql's header. On a
-- taken idempotency key no row comes back and nothing else is written (not
-- even a job id drawn).
CREATE FUNCTION place_order(
    customer_email text, customer_name text, currency text, total_cents bigint,
    idempotency_key text, request_hash text, api_key_id bigint,
    skus text[], names text[], quantities int[], unit_prices bigint[],
    event_type text, payment_window_ms bigint, max_attempts int, fanout_inline bigint,
    trace_context jsonb, notify_channel text,
    confirmation_kind text, receipt_kind text, webhook_kind text,
    publish_kind text, fanout_kind text)
RETURNS TABLE (order_id bigint, created_at timestamptz, expires_at timestamptz,
               item_ids bigint[], event_id bigint, job_ids bigint[], job_kinds text[],
               notified bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    s record;
    fan_out boolean;
    endpoints bigint[];
    -- The planned jobs, one element each, in enqueue order (n = index).
    kinds text[];
    payloads jsonb[];
    ordering_keys text[];
    concurrency_keys text[];
    ids bigint[];
    kind text;
BEGIN
    INSERT INTO orders AS o (customer_email, customer_name, currency, total_cents,
                             idempotency_key, request_hash, api_key_id, expires_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, now() + $13 * interval '1 millisecond')
    ON CONFLICT DO NOTHING
    RETURNING o.id, o.created_at, o.expires_at
    INTO place_order.order_id, place_order.created_at, place_order.expires_at;
    IF place_order.order_id IS NULL THEN
        RETURN;
    END IF;

    -- In the request's order, so the ids ascend in that order.
    WITH written AS (
        INSERT INTO order_items (order_id, sku, name, quantity, unit_price_cents)
        SELECT place_order.order_id, item.sku, item.name, item.quantity, item.price
        FROM unnest($8, $9, $10, $11) WITH ORDINALITY AS item (sku, name, quantity, price, n)
        ORDER BY item.n
        RETURNING id
    )
    SELECT coalesce(array_agg(written.id ORDER BY written.id), '{}')
    INTO place_order.item_ids FROM written;

    INSERT INTO order_events AS e (order_id, seq, type, data, api_key_id)
    VALUES (place_order.order_id, 1, $12, '{}'::jsonb, $7)
    RETURNING e.id INTO place_order.event_id;

    SELECT * INTO s FROM order_event_subscribers($12);
    fan_out := s.any_endpoint AND s.endpoint_count > $15;

    kinds := ARRAY[$18, $19];
    payloads := ARRAY[
        jsonb_build_object('order_id', place_order.order_id, 'event_id', place_order.event_id),
        jsonb_build_object('order_id', place_order.order_id)];
    ordering_keys := ARRAY['order-' || place_order.order_id || '-emails', NULL];
    concurrency_keys := ARRAY[NULL, NULL]::text[];
    IF NOT s.any_endpoint THEN
        kinds := kinds || $20;
        payloads := payloads || jsonb_build_object(
            'order_id', place_order.order_id, 'event_id', place_order.event_id);
        ordering_keys := ordering_keys || ('order-' || place_order.order_id || '-webhooks');
        concurrency_keys := concurrency_keys || NULL::text;
    ELSIF fan_out THEN
        kinds := kinds || $22;
        payloads := payloads || jsonb_build_object(
            'order_id', place_order.order_id, 'event_id', place_order.event_id,
            'max_attempts', $14, 'webhook_endpoints', s.webhook_runs,
            'nats_endpoints', s.nats_runs);
        ordering_keys := ordering_keys || ('order-' || place_order.order_id || '-fanout');
        concurrency_keys := concurrency_keys || NULL::text;
    ELSE
        -- Webhooks first, then NATS, each in its array's (ascending) order.
        endpoints := s.webhook_endpoints || s.nats_endpoints;
        FOR i IN 1 .. cardinality(endpoints) LOOP
            kinds := kinds
                || CASE WHEN i <= cardinality(s.webhook_endpoints) THEN $20 ELSE $21 END;
            payloads := payloads || jsonb_build_object(
                'order_id', place_order.order_id, 'event_id', place_order.event_id,
                'endpoint_id', endpoints[i]);
            ordering_keys := ordering_keys
                || ('endpoint:' || endpoints[i] || ':order:' || place_order.order_id);
            concurrency_keys := concurrency_keys || ('endpoint:' || endpoints[i]);
        END LOOP;
        -- As ensure_concurrency_keys.sql (the core's) writes them: existing
        -- rows skipped by a plain read, which never waits, ON CONFLICT DO
        -- NOTHING for a key created at the same moment.
        INSERT INTO job_concurrency_keys (key)
        SELECT DISTINCT k.key FROM unnest(concurrency_keys) AS k (key)
        WHERE k.key IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM job_concurrency_keys AS c WHERE c.key = k.key)
        ORDER BY k.key
        ON CONFLICT (key) DO NOTHING;
    END IF;

    -- Drawn ahead, ascending in enqueue order, so the confirmation (n = 1)
    -- can name its receipt (n = 2) as its parent, policy `run`. The
    -- sequence by name: pg_get_serial_sequence, as the statement called it,
    -- read the catalog on every placement (about 20 µs a call at one client).
    SELECT array_agg(nextval('jobs_id_seq') ORDER BY n)
    INTO ids FROM generate_series(1, cardinality(kinds)) AS n;

    -- No job is blocked: every ordering key of a placement is its own (the
    -- order's, or an endpoint's for this order, each endpoint once), so no
    -- job waits behind an earlier one of the same placement, and no one
    -- else has seen this order yet.
    INSERT INTO jobs (id, kind, payload, max_attempts, ordering_key, blocked,
                      trace_context, concurrency_key, waiting_on, depends_on,
                      dependency_policy, has_dependents, order_id)
    SELECT j.id, j.kind, j.payload, greatest($14, 1), j.ordering_key, false,
           $16, j.concurrency_key,
           CASE WHEN j.n = 1 THEN ARRAY[ids[2]] ELSE '{}' END,
           CASE WHEN j.n = 1 THEN ARRAY[ids[2]] END,
           CASE WHEN j.n = 1 THEN 'run' END,
           -- The receipt has the email as its dependent; no other job has
           -- one (the finish looks for dependents only where this is not
           -- false).
           j.n = 2,
           place_order.order_id
    FROM unnest(ids, kinds, payloads, ordering_keys, concurrency_keys)
         WITH ORDINALITY AS j (id, kind, payload, ordering_key, concurrency_key, n);
    job_ids := ids;
    job_kinds := kinds;

    notified := 0;
    IF $17 IS NOT NULL THEN
        FOR kind IN SELECT DISTINCT k FROM unnest(kinds) AS k ORDER BY k LOOP
            PERFORM pg_notify($17, kind);
            notified := notified + 1;
        END LOOP;
    END IF;
    RETURN NEXT;
END
$$;
