-- Records an order event and reads, in the same statement, the endpoints it
-- goes to: every enabled endpoint subscribed to its type (NULL event_types:
-- every type), from order_event_subscribers (in the migration), which
-- place_order.sql reads too. One round trip per event however many
-- endpoints there are; the endpoints table is small and read whole.
--
-- `any_endpoint` is false only in a database without endpoints, before a
-- relay (or `migrate`, or `serve`) has created `default` from WEBHOOK_URL:
-- the delivery is then queued without an endpoint (unaddressed) and goes to
-- `default` when it runs, so no event is lost in that window.
--
-- `default_behind_unaddressed` is the id of the endpoint named $9
-- (`default`) while the order still has an unfinished job (pending,
-- processing or failed) under $8 (`order-<id>-webhooks`), the key of its
-- unaddressed deliveries; NULL otherwise. The event's delivery to `default`
-- then takes that key, to queue behind them (orders/events.rs). Indexes: endpoints_name_key for the
-- name; jobs_ordering_key_idx for the key, one probe (done jobs have left
-- `jobs`; the status is a filter).
--
-- `behind_fanout` is whether the order still has an unfinished job under its
-- fan-out key $11 (`order-<id>-fanout`): an earlier event whose deliveries an
-- `order_fanout` job has not written yet. This event then goes through a
-- fan-out too, queued behind it, so its deliveries cannot overtake that
-- event's (orders/events.rs). One probe of jobs_ordering_key_idx, as above,
-- and the same reasoning about the order row's lock holds: only this order's
-- transitions add jobs under the key.
--
-- Concurrency: the caller holds the order row's lock (FOR NO KEY UPDATE),
-- which serialises the order's transitions, the only writers of its
-- unaddressed deliveries' key after the placement, which committed before
-- anyone could see the order. This statement's snapshot is taken after that lock was granted, so
-- it sees the jobs of every earlier transition. Meanwhile other transactions
-- can only end the key's jobs (a finish, a cancel), never add one (a retry or
-- a recover turns a failed job, already unfinished, back to pending). A job
-- that ends between this read and the enqueue leaves the new delivery under
-- that key with nothing ahead: the enqueue's own key lock and head lookup
-- (lock_ordering_keys.sql, lock_ordering_heads.sql) decide whether it waits,
-- as for any key, and it runs at once.
WITH event AS (
    INSERT INTO order_events (order_id, seq, type, data, idempotency_key, request_hash, api_key_id,
                              inbox_message_id)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $10)
    RETURNING id
)
SELECT
    event.id AS event_id,
    subscribers.webhook_endpoints,
    subscribers.nats_endpoints,
    subscribers.any_endpoint,
    (SELECT d.id FROM endpoints d
     WHERE d.name = $9
       AND EXISTS (SELECT 1 FROM jobs j
                   WHERE j.ordering_key = $8
                     AND j.status IN ('pending', 'processing', 'failed'))
    ) AS default_behind_unaddressed,
    EXISTS (SELECT 1 FROM jobs j
            WHERE j.ordering_key = $11
              AND j.status IN ('pending', 'processing', 'failed')) AS behind_fanout
FROM event, order_event_subscribers($3) AS subscribers
