-- Records an order event and reads, in the same statement, the endpoints it
-- goes to: every enabled endpoint subscribed to its type (NULL event_types:
-- every type). One round trip per event however many endpoints there are; the
-- endpoints table is small and read whole.
--
-- `any_endpoint` is false only in a database without endpoints, as before
-- this change or before a relay has created `default` from WEBHOOK_URL: the
-- delivery is then queued without an endpoint and goes to `default` when it
-- runs, so no event is lost in that window.
WITH event AS (
    INSERT INTO order_events (order_id, seq, type, data, idempotency_key, request_hash, api_key_id)
    VALUES ($1, $2, $3, $4, $5, $6, $7)
    RETURNING id
)
SELECT
    event.id AS event_id,
    coalesce(
        (SELECT array_agg(e.id ORDER BY e.id) FROM endpoints e
         WHERE e.enabled AND e.url !~ '^nats://'
           AND (e.event_types IS NULL OR $3 = ANY (e.event_types))),
        '{}'
    ) AS webhook_endpoints,
    coalesce(
        (SELECT array_agg(e.id ORDER BY e.id) FROM endpoints e
         WHERE e.enabled AND e.url ~ '^nats://'
           AND (e.event_types IS NULL OR $3 = ANY (e.event_types))),
        '{}'
    ) AS nats_endpoints,
    EXISTS (SELECT 1 FROM endpoints) AS any_endpoint
FROM event
