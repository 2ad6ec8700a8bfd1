-- Orders and their lines. Column names are a contract (the README, "The order API").
CREATE TABLE orders (
    id               bigserial   PRIMARY KEY,
    customer_email   text        NOT NULL,
    customer_name    text        NOT NULL,
    currency         char(3)     NOT NULL,
    total_cents      bigint      NOT NULL,
    -- Stored with the order, in the same transaction, so a retried POST finds it.
    idempotency_key  text        NULL,
    -- SHA-256 of the canonical request body: the same key with another body is a conflict.
    request_hash     text        NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT orders_idempotency_key_unique UNIQUE (idempotency_key),
    CONSTRAINT orders_currency_is_iso_4217 CHECK (currency ~ '^[A-Z]{3}$'),
    CONSTRAINT orders_total_not_negative CHECK (total_cents >= 0)
);

CREATE TABLE order_items (
    id               bigserial PRIMARY KEY,
    order_id         bigint    NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    sku              text      NOT NULL,
    name             text      NOT NULL,
    quantity         int       NOT NULL,
    unit_price_cents bigint    NOT NULL,
    CONSTRAINT order_items_quantity_positive CHECK (quantity > 0),
    CONSTRAINT order_items_unit_price_not_negative CHECK (unit_price_cents >= 0)
);

CREATE INDEX order_items_order_id_idx ON order_items (order_id);
