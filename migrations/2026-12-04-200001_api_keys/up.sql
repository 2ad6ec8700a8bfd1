-- API keys (the README, "The order API"): a key is a capability, named by
-- its scopes. Only the SHA-256 of the secret is kept: the secret is 256
-- random bits, so a fast hash is enough (no one can guess their way to a
-- preimage), and the request path looks a key up by its hash in one probe.
CREATE TABLE api_keys (
    id            bigserial   PRIMARY KEY,
    name          text        NOT NULL,
    scopes        text[]      NOT NULL,
    secret_sha256 bytea       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    -- NULL: never expires.
    expires_at    timestamptz NULL,
    -- Written at most about once a minute per key, not on every request:
    -- a write per request would cost the API its placement rate.
    last_used_at  timestamptz NULL,
    -- A revoked key is kept, not deleted: orders keep naming the key that
    -- placed them, and `keys list` shows when it was revoked.
    revoked_at    timestamptz NULL,
    CONSTRAINT api_keys_name_unique UNIQUE (name),
    CONSTRAINT api_keys_secret_sha256_unique UNIQUE (secret_sha256),
    CONSTRAINT api_keys_name_valid CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    CONSTRAINT api_keys_secret_sha256_is_a_sha256 CHECK (octet_length(secret_sha256) = 32),
    -- The scopes of the contract, and at least one of them.
    CONSTRAINT api_keys_scopes_known CHECK (
        cardinality(scopes) > 0
        AND scopes <@ ARRAY[
            'orders:place', 'orders:read', 'orders:pay', 'orders:ship',
            'orders:deliver', 'orders:cancel', 'orders:*'
        ]::text[]
    )
);

-- Idempotency keys belong to the API key that sent them: two clients that
-- happen to pick the same Idempotency-Key each get their own order, and one
-- cannot take another's key first. `api_key_id` is NULL for orders placed
-- without a key (`API_AUTH=none`, the library's place_order); those share
-- one space, as before. No foreign key: keys are never deleted, and a
-- foreign key would add a probe and a row lock on api_keys to every
-- placement.
ALTER TABLE orders ADD COLUMN api_key_id bigint NULL;
ALTER TABLE orders DROP CONSTRAINT orders_idempotency_key_unique;
CREATE UNIQUE INDEX orders_idempotency_key_per_api_key
    ON orders (api_key_id, idempotency_key) WHERE api_key_id IS NOT NULL;
CREATE UNIQUE INDEX orders_idempotency_key_without_api_key
    ON orders (idempotency_key) WHERE api_key_id IS NULL;

ALTER TABLE order_events ADD COLUMN api_key_id bigint NULL;
ALTER TABLE order_events DROP CONSTRAINT order_events_idempotency_key_unique;
CREATE UNIQUE INDEX order_events_idempotency_key_per_api_key
    ON order_events (api_key_id, idempotency_key) WHERE api_key_id IS NOT NULL;
CREATE UNIQUE INDEX order_events_idempotency_key_without_api_key
    ON order_events (idempotency_key) WHERE api_key_id IS NULL;
