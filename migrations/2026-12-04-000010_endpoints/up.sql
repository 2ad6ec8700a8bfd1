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
    -- The signing secrets: `secret` signs every delivery (space-separated
    -- secrets as WEBHOOK_SECRET takes them, for the `default` endpoint); after a
    -- rotation `previous_secret` still signs until `previous_secret_expires_at`,
    -- so receivers can move to the new one without a failed delivery. They are
    -- kept in the clear because signing needs them: protect the database (and
    -- its backups) as you protect the secrets.
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
    CONSTRAINT endpoints_name_key UNIQUE (name),
    -- Names go into ordering keys, metric labels and shell commands.
    CONSTRAINT endpoints_name_valid CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$'),
    CONSTRAINT endpoints_url_scheme CHECK (url ~ '^(https?|nats)://'),
    CONSTRAINT endpoints_http_allowed CHECK (url !~ '^http://' OR allow_http),
    CONSTRAINT endpoints_nats_has_stream CHECK (
        (url ~ '^nats://') = (stream IS NOT NULL AND subject_prefix IS NOT NULL)
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

COMMENT ON TABLE endpoints IS
    'Subscribers to order events: webhook URLs and NATS JetStream streams (outbox-relay endpoints ...).';
