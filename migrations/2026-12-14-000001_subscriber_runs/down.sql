DROP FUNCTION order_event_subscribers(text);
CREATE FUNCTION order_event_subscribers(event_type text)
RETURNS TABLE (webhook_endpoints bigint[], nats_endpoints bigint[], any_endpoint boolean)
LANGUAGE sql STABLE AS $$
    SELECT c.webhook_endpoints, c.nats_endpoints, c.any_endpoint
    FROM event_type_subscribers AS c
    WHERE c.event_type = order_event_subscribers.event_type
    UNION ALL
    SELECT s.webhook_endpoints, s.nats_endpoints, s.any_endpoint
    FROM order_event_subscribers_now(order_event_subscribers.event_type) AS s
    WHERE NOT EXISTS (
        SELECT 1 FROM event_type_subscribers AS c
        WHERE c.event_type = order_event_subscribers.event_type
    )
$$;
ALTER TABLE event_type_subscribers
    DROP COLUMN endpoint_count,
    DROP COLUMN webhook_runs,
    DROP COLUMN nats_runs;
DROP FUNCTION endpoint_id_runs(bigint[]);
