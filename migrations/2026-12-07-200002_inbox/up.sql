-- Payments in: the senders of inbound events (`sources`), the messages they
-- sent (`inbox_messages`, the core's table plus the service's columns), the
-- refund transition, and who caused each order event.

-- A sender of signed webhooks: a payment provider. `name` is the last part
-- of its URL (POST /inbound/{name}); `kind` says how its messages are
-- signed. The secrets are kept in the clear because verifying needs them,
-- as endpoints keep theirs: protect the database as you protect them. After
-- a rotation `previous_secret` still verifies until
-- `previous_secret_expires_at`, so messages signed before the sender
-- switched keys still pass.
CREATE TABLE sources (
    id                         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name                       text        NOT NULL,
    kind                       text        NOT NULL,
    secret                     text        NOT NULL,
    previous_secret            text        NULL,
    previous_secret_expires_at timestamptz NULL,
    created_at                 timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT sources_name_key UNIQUE (name),
    -- Names go into URLs, metric labels and shell commands.
    CONSTRAINT sources_name_valid CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$'),
    CONSTRAINT sources_kind_valid CHECK (kind IN ('stripe', 'standard')),
    CONSTRAINT sources_secret_not_empty CHECK (secret <> ''),
    CONSTRAINT sources_previous_secret_expires CHECK (
        (previous_secret IS NULL) = (previous_secret_expires_at IS NULL)
    )
);

-- The core's inbox table, exactly as the core's migration 2026-12-07-200001
-- makes it: this set runs before the core's, and adds columns to it below.
-- The core's migration is then recorded as applied, as the core's baseline
-- was (2026-12-03-000002).
CREATE TABLE IF NOT EXISTS inbox_messages (
    id          bigserial   PRIMARY KEY,
    source      text        NOT NULL,
    message_id  text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT inbox_messages_unique UNIQUE (source, message_id)
);
CREATE INDEX IF NOT EXISTS inbox_messages_received_at_idx ON inbox_messages (received_at);
INSERT INTO __diesel_schema_migrations (version) VALUES ('20261207200001')
ON CONFLICT DO NOTHING;

-- What each message was and what it did, written in the transaction that
-- records it. `status` is NULL only for a row the core recorded without
-- this service (a library user's own source); every message this service
-- receives gets one.
ALTER TABLE inbox_messages
    ADD COLUMN type       text        NULL,
    -- The order it names, when one matched (no foreign key: a message is
    -- kept as received even if its order is later deleted).
    ADD COLUMN order_id   bigint      NULL,
    ADD COLUMN status     text        NULL,
    -- Why it is held, ignored or unmatched; what an operator decided.
    ADD COLUMN reason     text        NULL,
    ADD COLUMN payload    jsonb       NULL,
    -- When it was applied, ignored or dismissed; NULL while held.
    ADD COLUMN decided_at timestamptz NULL,
    ADD CONSTRAINT inbox_messages_status_valid CHECK (
        status IN ('applied', 'held', 'unmatched', 'ignored', 'dismissed')
    );

-- `inbox list --status held` and the dashboard's filters: newest first.
CREATE INDEX inbox_messages_status_idx ON inbox_messages (status, id DESC);
-- "Paid again under another reference": an order's earlier payments.
CREATE INDEX inbox_messages_order_id_idx ON inbox_messages (order_id)
    WHERE order_id IS NOT NULL;

-- The refund: paid, shipped or delivered -> refunded.
ALTER TABLE orders DROP CONSTRAINT orders_status_valid;
ALTER TABLE orders ADD CONSTRAINT orders_status_valid CHECK (
    status IN ('placed', 'paid', 'shipped', 'delivered', 'cancelled', 'refunded')
);
ALTER TABLE order_events DROP CONSTRAINT order_events_type_valid;
ALTER TABLE order_events ADD CONSTRAINT order_events_type_valid CHECK (type IN (
    'order.placed', 'order.paid', 'order.shipped', 'order.delivered', 'order.cancelled',
    'order.refunded'
));

-- The inbox message that caused an event (a provider's payment or refund);
-- NULL for events an API call or the placement caused.
ALTER TABLE order_events ADD COLUMN inbox_message_id bigint NULL;

-- Every scope of the contract, orders:refund among them.
ALTER TABLE api_keys DROP CONSTRAINT api_keys_scopes_known;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_scopes_known CHECK (
    cardinality(scopes) > 0
    AND scopes <@ ARRAY[
        'orders:place', 'orders:read', 'orders:read:own', 'orders:pay', 'orders:ship',
        'orders:deliver', 'orders:cancel', 'orders:refund', 'orders:*'
    ]::text[]
);

-- An operator's decision on a held message is audited like the dashboard's
-- other actions.
ALTER TABLE admin_audit DROP CONSTRAINT admin_audit_action_valid;
ALTER TABLE admin_audit ADD CONSTRAINT admin_audit_action_valid CHECK (
    action IN ('retry', 'cancel', 'endpoint.enable', 'endpoint.disable', 'endpoint.recover',
               'inbox.apply', 'inbox.dismiss')
);
