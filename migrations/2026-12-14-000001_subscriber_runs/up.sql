-- An order's `order_fanout` job names its endpoints as runs of ids
-- ([[first, last], ...]: jobs.rs's id_runs). place_order.sql computed them
-- from event_type_subscribers' arrays for every order, by an unnest, a
-- window and a grouping over every subscribed endpoint: about 0.2 to 0.5 µs
-- per endpoint per order inside the customer's transaction, the one cost of
-- placement that still grew with the endpoints past FANOUT_INLINE
-- (docs/performance.md). They change only when the endpoints do, so the row
-- keeps them, computed by PostgreSQL whenever the arrays are written (by the
-- endpoints' triggers), with the count that decides inline or fan-out.

-- The runs of consecutive values in `ids` (sorted, no duplicates, as the
-- arrays of event_type_subscribers are), as a JSON array of [first, last].
CREATE FUNCTION endpoint_id_runs(ids bigint[]) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_array(r.first, r.last) ORDER BY r.first), '[]')
    FROM (SELECT min(id) AS first, max(id) AS last
          FROM (SELECT id, id - row_number() OVER (ORDER BY id) AS run
                FROM unnest(ids) AS id) AS numbered
          GROUP BY run) AS r
$$;

ALTER TABLE event_type_subscribers
    ADD COLUMN endpoint_count integer
        GENERATED ALWAYS AS (cardinality(webhook_endpoints) + cardinality(nats_endpoints)) STORED,
    ADD COLUMN webhook_runs jsonb
        GENERATED ALWAYS AS (endpoint_id_runs(webhook_endpoints)) STORED,
    ADD COLUMN nats_runs jsonb
        GENERATED ALWAYS AS (endpoint_id_runs(nats_endpoints)) STORED;

-- order_event_subscribers as before, with the count and the runs, so that a
-- placement reads them in the same probe of the row as the endpoints; a
-- type without a row computes them from the endpoints.
DROP FUNCTION order_event_subscribers(text);
CREATE FUNCTION order_event_subscribers(event_type text)
RETURNS TABLE (webhook_endpoints bigint[], nats_endpoints bigint[], any_endpoint boolean,
               endpoint_count integer, webhook_runs jsonb, nats_runs jsonb)
LANGUAGE sql STABLE AS $$
    SELECT c.webhook_endpoints, c.nats_endpoints, c.any_endpoint,
           c.endpoint_count, c.webhook_runs, c.nats_runs
    FROM event_type_subscribers AS c
    WHERE c.event_type = order_event_subscribers.event_type
    UNION ALL
    SELECT s.webhook_endpoints, s.nats_endpoints, s.any_endpoint,
           cardinality(s.webhook_endpoints) + cardinality(s.nats_endpoints),
           endpoint_id_runs(s.webhook_endpoints), endpoint_id_runs(s.nats_endpoints)
    FROM order_event_subscribers_now(order_event_subscribers.event_type) AS s
    WHERE NOT EXISTS (
        SELECT 1 FROM event_type_subscribers AS c
        WHERE c.event_type = order_event_subscribers.event_type
    )
$$;
