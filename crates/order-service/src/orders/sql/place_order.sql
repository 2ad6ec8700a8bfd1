-- Writes a new order, its items and its `order.placed` event, and reads the
-- endpoints the event goes to, in one statement: one round trip where three
-- statements took three (orders/place.rs says why that counts). The jobs are
-- the enqueuer's, in the next statement.
--
-- $1 … $7: the order's row ($7, the API key that placed it, is its first
-- event's too). $8 … $11: its items, one array per column, in
-- the request's order. $12: the event type. $13: the payment window in
-- milliseconds (ORDER_PAYMENT_WINDOW), NULL without one: `expires_at` is
-- `created_at` plus it, both this transaction's now().
--
-- Only the idempotency indexes can conflict (the id is a sequence's):
-- orders_idempotency_key_per_api_key and orders_idempotency_key_without_api_key,
-- partial indexes that an ON CONFLICT target could not name without their
-- predicate. On a conflict `new_order` is empty, so nothing else is written
-- and no row comes back.
--
-- The items are inserted in the request's order, so their ids (a sequence's)
-- ascend in that order, as the multi-row VALUES they replace drew them. The
-- foreign keys of the items and the event are checked at the end of the
-- statement, once the order's row is there.
--
-- The endpoint columns are the subscribers of the event's type, as
-- order_event_subscribers (in the migration) reads them; see
-- record_event.sql. A new order has no unaddressed deliveries, so none of
-- its deliveries waits behind one (`default_behind_unaddressed` is NULL).
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
)
SELECT
    new_order.id AS order_id,
    new_order.created_at,
    new_order.expires_at,
    coalesce((SELECT array_agg(items.id ORDER BY items.id) FROM items), '{}') AS item_ids,
    event.id AS event_id,
    subscribers.webhook_endpoints,
    subscribers.nats_endpoints,
    subscribers.any_endpoint,
    NULL::bigint AS default_behind_unaddressed
FROM new_order, event, order_event_subscribers($12) AS subscribers
