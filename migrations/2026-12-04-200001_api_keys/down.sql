DROP INDEX order_events_idempotency_key_without_api_key;
DROP INDEX order_events_idempotency_key_per_api_key;
-- Fails if two API keys used the same Idempotency-Key: that is data the old
-- schema cannot hold.
ALTER TABLE order_events ADD CONSTRAINT order_events_idempotency_key_unique UNIQUE (idempotency_key);
ALTER TABLE order_events DROP COLUMN api_key_id;

DROP INDEX orders_idempotency_key_without_api_key;
DROP INDEX orders_idempotency_key_per_api_key;
ALTER TABLE orders ADD CONSTRAINT orders_idempotency_key_unique UNIQUE (idempotency_key);
ALTER TABLE orders DROP COLUMN api_key_id;

DROP TABLE api_keys;
