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
