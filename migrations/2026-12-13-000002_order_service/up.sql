-- The order service's schema, whole: orders and their events, receipts, the
-- dashboard's tables, API keys, endpoints and their attempt log, the senders
-- of inbound events, and the effect ledger. It runs after the queue core's
-- migrations (db::run_migrations) and adds this service's columns to the
-- core's `jobs`, `jobs_done` and `inbox_messages`.

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
    -- placed -> paid -> shipped -> delivered; placed or paid -> cancelled;
    -- paid, shipped or delivered -> refunded; placed -> expired.
    status           text        NOT NULL DEFAULT 'placed',
    -- The API key that placed it. No foreign key: keys are never deleted, and
    -- one would add a probe and a row lock on api_keys to every placement.
    api_key_id       bigint      NULL,
    -- ORDER_PAYMENT_WINDOW: created_at + the window in force at placing,
    -- cleared by every transition out of `placed`; a relay's sweep moves an
    -- order past it placed -> expired (event `order.expired`).
    expires_at       timestamptz NULL,
    CONSTRAINT orders_currency_is_iso_4217 CHECK (currency ~ '^[A-Z]{3}$'),
    CONSTRAINT orders_total_not_negative CHECK (total_cents >= 0),
    CONSTRAINT orders_status_valid CHECK (
        status IN ('placed', 'paid', 'shipped', 'delivered', 'cancelled', 'refunded', 'expired')
    ),
    CONSTRAINT orders_expires_only_while_placed
        CHECK (expires_at IS NULL OR status = 'placed')
);

COMMENT ON COLUMN orders.expires_at IS 'When this placed order expires unless paid (ORDER_PAYMENT_WINDOW at placing); NULL otherwise.';

-- Idempotency keys belong to the API key that sent them: two clients that
-- pick the same Idempotency-Key each get their own order. Orders placed
-- without a key (`API_AUTH=none`, the library's place_order) share one space.
CREATE UNIQUE INDEX orders_idempotency_key_per_api_key
    ON orders (api_key_id, idempotency_key) WHERE api_key_id IS NOT NULL;
CREATE UNIQUE INDEX orders_idempotency_key_without_api_key
    ON orders (idempotency_key) WHERE api_key_id IS NULL;

-- The expiry sweep's index: only orders awaiting payment under a window, so
-- the sweep reads the due ones in expires_at order and nothing else; an
-- order placed without a window adds no entry.
CREATE INDEX orders_expiry_due_idx ON orders (expires_at)
    WHERE status = 'placed' AND expires_at IS NOT NULL;

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

-- One row per transition (and one for the placement). seq numbers an order's
-- events 1, 2, ... in commit order: a transition locks its order row first, so
-- two transitions of one order never number concurrently.
CREATE TABLE order_events (
    id               bigserial   PRIMARY KEY,
    order_id         bigint      NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    seq              int         NOT NULL,
    type             text        NOT NULL,
    data             jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- A transition's Idempotency-Key, stored with its event in the same
    -- transaction, so a retried request finds it.
    idempotency_key  text        NULL,
    request_hash     text        NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    -- The API key that caused the event (an order's own key for its
    -- placement); NULL without one.
    api_key_id       bigint      NULL,
    -- The inbox message that caused the event (a provider's payment or
    -- refund); NULL for events an API call or the placement caused.
    inbox_message_id bigint      NULL,
    -- How many of the event's deliveries its `order_fanout` job has written,
    -- moved with each batch, so a fan-out that dies halfway carries on where
    -- it stopped; 0 for events whose own transaction wrote their deliveries.
    fanned_out       integer     NOT NULL DEFAULT 0 CHECK (fanned_out >= 0),
    CONSTRAINT order_events_seq_unique UNIQUE (order_id, seq),
    CONSTRAINT order_events_seq_positive CHECK (seq > 0),
    CONSTRAINT order_events_type_valid CHECK (type IN (
        'order.placed', 'order.paid', 'order.shipped', 'order.delivered', 'order.cancelled',
        'order.refunded', 'order.expired'
    ))
);

-- A transition's Idempotency-Key, scoped to its API key as an order's is.
CREATE UNIQUE INDEX order_events_idempotency_key_per_api_key
    ON order_events (api_key_id, idempotency_key) WHERE api_key_id IS NOT NULL;
CREATE UNIQUE INDEX order_events_idempotency_key_without_api_key
    ON order_events (idempotency_key) WHERE api_key_id IS NULL;

-- One PDF receipt per order. Written in the same transaction that marks its
-- receipt_pdf job done, so it exists exactly once however often the job runs.
CREATE TABLE receipts (
    order_id   bigint      PRIMARY KEY REFERENCES orders (id) ON DELETE CASCADE,
    pdf        bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The order a job belongs to: this service's column of the core's `jobs`
-- and `jobs_done` (the core knows nothing of orders and writes only its own
-- columns). NULL for jobs a library user enqueues without an order.
ALTER TABLE jobs ADD COLUMN order_id bigint NULL REFERENCES orders (id) ON DELETE SET NULL;
ALTER TABLE jobs_done ADD COLUMN order_id bigint NULL;

-- GET /orders/{id}; jobs enqueued without an order cost it nothing.
CREATE INDEX jobs_order_id_idx ON jobs (order_id) WHERE order_id IS NOT NULL;

-- No btree and no foreign key on the archive: each would cost an entry or a
-- lookup per finished job. Rows are appended in finished_at order, so order
-- ids rise with the heap: a BRIN summary per 16 pages finds an order's jobs
-- by reading a few ranges, and costs nothing per row.
CREATE INDEX jobs_done_order_id_brin ON jobs_done USING brin (order_id) WITH (pages_per_range = 16, autosummarize = on);

-- The service writes `order_id` on enqueue (orders::jobs::insert_order_jobs);
-- on the move to the archive, the core's statement that copies only its own
-- columns, this trigger sets it from the payload. It fires only for payloads
-- with an `order_id` (the WHEN clause costs no call), and links a job only to
-- an order that exists, as `jobs`' foreign key does.
CREATE FUNCTION jobs_order_id_from_payload() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wanted numeric;
BEGIN
    IF jsonb_typeof(NEW.payload -> 'order_id') = 'number' THEN
        wanted := (NEW.payload ->> 'order_id')::numeric;
        -- Compared as bigint, so the lookup is a probe of orders_pkey: an
        -- `id = numeric` comparison would cast every id and scan the table.
        IF wanted = trunc(wanted) AND wanted BETWEEN 1 AND 9223372036854775807 THEN
            SELECT o.id INTO NEW.order_id
            FROM orders AS o
            WHERE o.id = wanted::bigint;
        END IF;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER jobs_done_order_id_from_payload
    BEFORE INSERT ON jobs_done
    FOR EACH ROW
    WHEN (NEW.order_id IS NULL AND NEW.payload ? 'order_id')
    EXECUTE FUNCTION jobs_order_id_from_payload();

-- jobs_all gains `order_id`, after the core's columns, as the core's
-- migration says an application's own columns are added.
CREATE OR REPLACE VIEW jobs_all AS
SELECT * FROM jobs
UNION ALL
SELECT * FROM jobs_done;

-- The operator dashboard's audit log: every action taken through /admin (who,
-- what, when, how many), written after the action's last batch. Append-only;
-- nothing in the application updates or deletes a row.
CREATE TABLE admin_audit (
    id         bigserial   PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    -- Which token acted ("operator#1"): tokens are secrets, never stored.
    actor      text        NOT NULL,
    -- Retry or cancel jobs; enable, disable or recover an endpoint; apply or
    -- dismiss a held inbox message.
    action     text        NOT NULL,
    -- What was asked for: the job ids, or the filter every matching job was taken from.
    target     jsonb       NOT NULL,
    -- Jobs the action changed (a recovery's deliveries; none for enabling or
    -- disabling an endpoint).
    affected   bigint      NOT NULL,
    CONSTRAINT admin_audit_action_valid CHECK (
        action IN ('retry', 'cancel', 'endpoint.enable', 'endpoint.disable', 'endpoint.recover',
                   'inbox.apply', 'inbox.dismiss')
    ),
    CONSTRAINT admin_audit_affected_not_negative CHECK (affected >= 0)
);

-- The dashboard lists the newest entries first.
CREATE INDEX admin_audit_at_idx ON admin_audit (at DESC);

-- Subscribers as data: each row is one receiver of order events, with its own
-- URL, secret, interest in event types, throttle and breaker state. The
-- relay's deliveries name their endpoint by id; `name` is what operators type.
CREATE TABLE endpoints (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL,
    url text NOT NULL,
    -- NULL: every event type. An empty array would subscribe to nothing, which
    -- is what `disable` is for.
    event_types text[],
    enabled boolean NOT NULL DEFAULT true,
    -- Why it is disabled: by an operator, or by the breaker after failing for
    -- ENDPOINT_DISABLE_AFTER. NULL while enabled.
    disabled_reason text,
    -- Deliveries per second at most, across every relay; NULL: no limit.
    rate_limit double precision,
    -- Deliveries in flight to this endpoint at once, across every relay.
    max_in_flight integer NOT NULL DEFAULT 16,
    -- `secret` signs every delivery (space-separated secrets, as WEBHOOK_SECRET
    -- takes them, for `default`); after a rotation `previous_secret` still
    -- signs until `previous_secret_expires_at`. Sealed under SECRETS_KEY.
    secret text NOT NULL,
    previous_secret text,
    previous_secret_expires_at timestamptz,
    -- Plain http:// is refused unless the endpoint was added with --allow-http.
    allow_http boolean NOT NULL DEFAULT false,
    -- Since when every attempt has failed; NULL while the last attempt succeeded.
    failing_since timestamptz,
    -- NATS JetStream endpoints (nats://): the stream that must capture
    -- `<subject_prefix>.>`, and that prefix.
    stream text,
    subject_prefix text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    -- A NATS endpoint's own credentials as JSON text (`{"creds": "..."}`,
    -- `{"user": "...", "password": "..."}`, `{"token": "..."}`), sealed like
    -- the secrets; NULL: the relay's NATS_CREDENTIALS. Never shown back.
    nats_credentials text,
    CONSTRAINT endpoints_name_key UNIQUE (name),
    -- Names go into ordering keys, metric labels and shell commands.
    CONSTRAINT endpoints_name_valid CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$'),
    CONSTRAINT endpoints_url_scheme CHECK (url ~ '^(https?|nats)://'),
    CONSTRAINT endpoints_http_allowed CHECK (url !~ '^http://' OR allow_http),
    CONSTRAINT endpoints_nats_has_stream CHECK (
        (url ~ '^nats://') = (stream IS NOT NULL AND subject_prefix IS NOT NULL)
    ),
    CONSTRAINT endpoints_nats_credentials_nats_only CHECK (
        nats_credentials IS NULL OR stream IS NOT NULL
    ),
    CONSTRAINT endpoints_disabled_reason_valid CHECK (
        (enabled AND disabled_reason IS NULL)
        OR (NOT enabled AND disabled_reason IN ('operator', 'failing'))
    ),
    CONSTRAINT endpoints_rate_limit_positive CHECK (rate_limit IS NULL OR rate_limit > 0),
    CONSTRAINT endpoints_max_in_flight_positive CHECK (max_in_flight > 0),
    CONSTRAINT endpoints_previous_secret_expires CHECK (
        (previous_secret IS NULL) = (previous_secret_expires_at IS NULL)
    )
);

-- The secret columns, sealed under SECRETS_KEY (XChaCha20-Poly1305, bound to
-- table, column and row: docs/security.md) or plaintext, told apart by prefix.
COMMENT ON TABLE endpoints IS 'Subscribers to order events: webhook URLs and NATS JetStream streams (outbox-relay endpoints ...).';
COMMENT ON COLUMN endpoints.secret IS 'Signing secret(s): enc:v1:<key id>:<base64> when sealed under SECRETS_KEY, else plaintext.';
COMMENT ON COLUMN endpoints.previous_secret IS 'The secret before the last rotation, until previous_secret_expires_at; sealed like secret.';
COMMENT ON COLUMN endpoints.nats_credentials IS 'The NATS endpoint''s own credentials (JSON); sealed like secret. NULL: NATS_CREDENTIALS.';

-- The endpoints each order event type goes to, kept current by the
-- endpoints' own statements (the triggers below), so that placing an order
-- reads one row here however many endpoints there are: every enabled
-- endpoint subscribed to it (NULL event_types: every type), by id, http(s)
-- and NATS apart; and whether any endpoint exists at all. Reading the
-- endpoints themselves cost each order about 0.8 µs per endpoint
-- (docs/performance.md), inside the customer's request.
CREATE TABLE event_type_subscribers (
    event_type        text     PRIMARY KEY,
    webhook_endpoints bigint[] NOT NULL,
    nats_endpoints    bigint[] NOT NULL,
    any_endpoint      boolean  NOT NULL
);

-- What event_type_subscribers holds for `event_type`, read from `endpoints`.
CREATE FUNCTION order_event_subscribers_now(event_type text)
RETURNS TABLE (webhook_endpoints bigint[], nats_endpoints bigint[], any_endpoint boolean)
LANGUAGE sql STABLE AS $$
    SELECT
        coalesce(array_agg(e.id ORDER BY e.id) FILTER (WHERE e.subscribed AND NOT e.nats), '{}'),
        coalesce(array_agg(e.id ORDER BY e.id) FILTER (WHERE e.subscribed AND e.nats), '{}'),
        count(*) > 0
    FROM (
        SELECT id,
               url ~ '^nats://' AS nats,
               enabled AND (event_types IS NULL OR event_type = ANY (event_types)) AS subscribed
        FROM endpoints
    ) AS e
$$;

INSERT INTO event_type_subscribers
SELECT t, s.webhook_endpoints, s.nats_endpoints, s.any_endpoint
FROM unnest(ARRAY['order.placed', 'order.paid', 'order.shipped', 'order.delivered',
                  'order.cancelled', 'order.refunded', 'order.expired']) AS t,
     order_event_subscribers_now(t) AS s;

-- A statement that may change who is subscribed (any insert, delete or
-- truncate; an update of url, event_types or enabled, not the attempt log's
-- failing_since) first takes the table's lock, so such statements take turns
-- from before they touch an endpoint, and then rewrites every row. The
-- rewrite is a statement of its own: under READ COMMITTED it reads a
-- snapshot taken after the lock, which holds every earlier writer's commit
-- and this transaction's own change, so the last writer to commit leaves
-- the rows right. Readers (placements) take no lock that waits on it.
CREATE FUNCTION event_type_subscribers_lock() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE event_type_subscribers IN SHARE ROW EXCLUSIVE MODE;
    RETURN NULL;
END
$$;

CREATE FUNCTION event_type_subscribers_refresh() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        -- One snapshot for the whole transaction could not see a writer
        -- that committed while this one waited for the lock.
        RAISE EXCEPTION 'endpoints are changed under READ COMMITTED only (here: %)',
            current_setting('transaction_isolation');
    END IF;
    UPDATE event_type_subscribers AS c
    SET webhook_endpoints = s.webhook_endpoints,
        nats_endpoints = s.nats_endpoints,
        any_endpoint = s.any_endpoint
    FROM event_type_subscribers AS k,
         LATERAL order_event_subscribers_now(k.event_type) AS s
    WHERE c.event_type = k.event_type
      AND (c.webhook_endpoints, c.nats_endpoints, c.any_endpoint)
          IS DISTINCT FROM (s.webhook_endpoints, s.nats_endpoints, s.any_endpoint);
    RETURN NULL;
END
$$;

CREATE TRIGGER endpoints_subscribers_lock
    BEFORE INSERT OR DELETE OR TRUNCATE OR UPDATE OF url, event_types, enabled ON endpoints
    FOR EACH STATEMENT EXECUTE FUNCTION event_type_subscribers_lock();
CREATE TRIGGER endpoints_subscribers_refresh
    AFTER INSERT OR DELETE OR TRUNCATE OR UPDATE OF url, event_types, enabled ON endpoints
    FOR EACH STATEMENT EXECUTE FUNCTION event_type_subscribers_refresh();

-- The endpoints an order event of type `event_type` goes to (place_order.sql,
-- record_event.sql): its row of event_type_subscribers, a primary-key probe;
-- a type without a row (none today: every type of order_events_type_valid has
-- one) is read from the endpoints. One SELECT, so PostgreSQL inlines it into
-- the calling statement.
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

-- The dashboard's own secrets, shared by every `serve` replica: the random
-- 'session_key' signs session cookies and form tokens (made by the first
-- `serve` that needs it, ON CONFLICT DO NOTHING), so a leaked cookie says
-- nothing about any ADMIN_TOKEN, and restarts keep every open session.
CREATE TABLE admin_secrets (
    name       text        PRIMARY KEY,
    secret     bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT admin_secrets_secret_long_enough CHECK (octet_length(secret) >= 32)
);

-- One row per dashboard login. A cookie is honoured only while its row is
-- here, unexpired and not revoked (logging out sets revoked_at, seen by every
-- replica); expired rows are deleted at later logins.
CREATE TABLE admin_sessions (
    -- 128 random bits, hex; the cookie carries it with its MAC.
    id         text        PRIMARY KEY,
    -- Which token logged in ("operator#1"); tokens themselves are never stored.
    actor      text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    revoked_at timestamptz,
    -- A session unused for ADMIN_SESSION_IDLE is refused; moved at most once
    -- a minute.
    last_used_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT admin_sessions_expire_after_creation CHECK (expires_at > created_at)
);

-- The clean-up at login deletes by expiry.
CREATE INDEX admin_sessions_expires_at_idx ON admin_sessions (expires_at);

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
            'orders:place', 'orders:read', 'orders:read:own', 'orders:pay', 'orders:ship',
            'orders:deliver', 'orders:cancel', 'orders:refund', 'orders:*'
        ]::text[]
    )
);

-- The attempt log of deliveries (`order_webhook`, `order_publish`), written
-- after each call whatever its outcome: the endpoints' success rate, latency
-- and breaker, and the dashboard's log. No foreign keys: an attempt outlives
-- its job and its endpoint; `jobs prune` deletes old rows.
CREATE TABLE delivery_attempts (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id bigint NOT NULL,
    endpoint_id bigint NOT NULL,
    -- The job's attempt number (jobs.attempts at the claim).
    attempt integer NOT NULL,
    started_at timestamptz NOT NULL,
    duration_ms integer NOT NULL,
    -- The receiver's HTTP status; NULL when no answer came (see outcome), and
    -- for a publish.
    status_code smallint,
    -- ok, retryable or permanent: what the attempt meant for the job.
    outcome text NOT NULL,
    -- The start of the answer's body, or the error when there was no answer.
    excerpt text,
    -- A publish's answer: its PubAck's stream sequence (NULL for a webhook
    -- call, or a publish that got no PubAck).
    stream_sequence bigint,
    CONSTRAINT delivery_attempts_outcome_valid CHECK (outcome IN ('ok', 'retryable', 'permanent')),
    CONSTRAINT delivery_attempts_excerpt_bounded CHECK (length(excerpt) <= 1000),
    CONSTRAINT delivery_attempts_duration_valid CHECK (duration_ms >= 0)
);

-- An endpoint's recent attempts (its log, success rate and p95), newest first.
CREATE INDEX delivery_attempts_endpoint_idx ON delivery_attempts (endpoint_id, started_at DESC, id DESC);
-- Retention (`jobs prune`) and a job's attempts.
CREATE INDEX delivery_attempts_started_idx ON delivery_attempts (started_at);
CREATE INDEX delivery_attempts_job_idx ON delivery_attempts (job_id);

COMMENT ON TABLE delivery_attempts IS 'One row per delivery attempt to an endpoint; pruned by outbox-relay jobs prune.';
COMMENT ON COLUMN delivery_attempts.stream_sequence IS 'A NATS publish: the stream sequence of its PubAck (the original one for a duplicate).';

-- Payments in: a sender of signed webhooks (a payment provider), at POST
-- /inbound/{name}; `kind` says how its messages are signed. After a rotation
-- `previous_secret` still verifies until `previous_secret_expires_at`.
CREATE TABLE sources (
    id                         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name                       text        NOT NULL,
    kind                       text        NOT NULL,
    secret                     text        NOT NULL,
    previous_secret            text        NULL,
    previous_secret_expires_at timestamptz NULL,
    created_at                 timestamptz NOT NULL DEFAULT now(),
    -- The Stripe mode it takes events from (`live`, `test`, `any`); an event
    -- of the other mode is stored `ignored` and changes no order.
    mode                       text        NOT NULL DEFAULT 'any',
    -- The provider API key that reads its event log for reconciliation (a
    -- Stripe restricted key that reads events); NULL: not reconciled.
    api_key                    text        NULL,
    CONSTRAINT sources_name_key UNIQUE (name),
    -- Names go into URLs, metric labels and shell commands.
    CONSTRAINT sources_name_valid CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$'),
    CONSTRAINT sources_kind_valid CHECK (kind IN ('stripe', 'standard')),
    CONSTRAINT sources_secret_not_empty CHECK (secret <> ''),
    CONSTRAINT sources_previous_secret_expires CHECK (
        (previous_secret IS NULL) = (previous_secret_expires_at IS NULL)
    ),
    CONSTRAINT sources_mode_valid CHECK (mode IN ('live', 'test', 'any')),
    -- Standard Webhooks marks no event live or test.
    CONSTRAINT sources_mode_of_kind CHECK (kind = 'stripe' OR mode = 'any'),
    CONSTRAINT sources_api_key_not_empty CHECK (api_key <> ''),
    -- Only Stripe's event log is read.
    CONSTRAINT sources_api_key_of_kind CHECK (kind = 'stripe' OR api_key IS NULL)
);

COMMENT ON COLUMN sources.secret IS 'Signing secret: enc:v1:<key id>:<base64> when sealed under SECRETS_KEY, else plaintext.';
COMMENT ON COLUMN sources.previous_secret IS 'The secret before the last rotation, until previous_secret_expires_at; sealed like secret.';
COMMENT ON COLUMN sources.mode IS 'live, test or any: the livemode of the Stripe events this source applies.';
COMMENT ON COLUMN sources.api_key IS 'The provider API key that reads its event log: enc:v1:<key id>:<base64> when sealed '
    'under SECRETS_KEY, else plaintext. NULL: not reconciled.';

-- The messages the sources sent: the core's `inbox_messages`, with what each
-- message was and what it did, written in the transaction that records it.
-- `status` is NULL only for a row the core recorded without this service (a
-- library user's own source); every message this service receives gets one.
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
    -- How it reached the inbox: `webhook` (POST /inbound/{source}) or
    -- `reconcile` (listed by the provider's event log, never received).
    ADD COLUMN via        text        NOT NULL DEFAULT 'webhook',
    ADD CONSTRAINT inbox_messages_status_valid CHECK (
        status IN ('applied', 'held', 'unmatched', 'ignored', 'dismissed')
    ),
    ADD CONSTRAINT inbox_messages_via_valid CHECK (via IN ('webhook', 'reconcile'));

-- `inbox list --status held` and the dashboard's filters: newest first.
CREATE INDEX inbox_messages_status_idx ON inbox_messages (status, id DESC);
-- "Paid again under another reference": an order's earlier payments.
CREATE INDEX inbox_messages_order_id_idx ON inbox_messages (order_id)
    WHERE order_id IS NOT NULL;

-- One row per reconciled source (`inbox reconcile`, the relays' periodic
-- job): `watermark` is the `created` time of the newest event a successful run
-- saw, less an overlap (the log's edge is not in strict creation order); the
-- next run asks from there. A failed run moves no watermark.
CREATE TABLE source_reconciliations (
    source_id      bigint      PRIMARY KEY REFERENCES sources (id) ON DELETE CASCADE,
    started_at     timestamptz NULL,
    finished_at    timestamptz NULL,
    watermark      timestamptz NULL,
    -- The last finished run: events listed, applied for the first time,
    -- already in the inbox, pages read.
    fetched        integer     NOT NULL DEFAULT 0,
    recovered      integer     NOT NULL DEFAULT 0,
    already        integer     NOT NULL DEFAULT 0,
    pages          integer     NOT NULL DEFAULT 0,
    -- Why the last run failed; NULL once a run succeeds.
    last_error     text        NULL,
    last_error_at  timestamptz NULL,
    CONSTRAINT source_reconciliations_counts_valid CHECK (
        fetched >= 0 AND recovered >= 0 AND already >= 0 AND pages >= 0
    ),
    CONSTRAINT source_reconciliations_error_at CHECK (
        (last_error IS NULL) = (last_error_at IS NULL)
    )
);

-- The effect ledger: what each job's peer answered when the job ended done,
-- written by the transaction that finishes it once the fenced finish matched,
-- so a zombie's late success writes nothing. No foreign key: a done job lives
-- in jobs_done, whose partitions retention drops.
CREATE TABLE effect_results (
    job_id bigint PRIMARY KEY,
    -- An email: its Message-ID and the SMTP server's reply to the message.
    message_id text,
    smtp_reply text,
    -- A webhook call: the endpoint (its name when called), the webhook-id
    -- sent, the final HTTP status and the SHA-256 (hex) of the answer's body
    -- as read (bounded).
    endpoint text,
    webhook_id text,
    status_code integer,
    answer_sha256 text,
    -- A NATS publish: the PubAck's stream, sequence and duplicate flag.
    stream text,
    stream_seq bigint,
    duplicate boolean,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT effect_results_status_code_is_http CHECK (status_code BETWEEN 100 AND 599),
    CONSTRAINT effect_results_answer_sha256_is_hex CHECK (answer_sha256 ~ '^[0-9a-f]{64}$'),
    CONSTRAINT effect_results_stream_seq_positive CHECK (stream_seq > 0)
);

COMMENT ON TABLE effect_results IS 'The effect ledger: one row per done job, written in the transaction that finished it (GET /orders/{id}/effects).';

-- `jobs prune` deletes the answers with the done jobs they describe, by age.
CREATE INDEX effect_results_recorded_at_idx ON effect_results (recorded_at);
