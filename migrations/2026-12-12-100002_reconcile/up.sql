-- Reconciliation against a provider's event log (`inbox reconcile`, and the
-- relays' periodic job): the API key that reads the log, how each message
-- arrived, and where each source's last run got to.

-- The provider's API key (a Stripe restricted key with read access to
-- events is enough). Sealed under SECRETS_KEY like every stored secret;
-- NULL: the source is not reconciled.
ALTER TABLE sources
    ADD COLUMN api_key text NULL,
    ADD CONSTRAINT sources_api_key_not_empty CHECK (api_key <> ''),
    -- Only Stripe's event log is read.
    ADD CONSTRAINT sources_api_key_of_kind CHECK (kind = 'stripe' OR api_key IS NULL);

COMMENT ON COLUMN sources.api_key IS
    'The provider API key that reads its event log: enc:v1:<key id>:<base64> when sealed '
    'under SECRETS_KEY, else plaintext. NULL: not reconciled.';

-- How a message reached the inbox: `webhook` (POST /inbound/{source}) or
-- `reconcile` (listed by the provider's event log, never received).
-- Every row written before this column arrived by webhook.
ALTER TABLE inbox_messages
    ADD COLUMN via text NOT NULL DEFAULT 'webhook',
    ADD CONSTRAINT inbox_messages_via_valid CHECK (via IN ('webhook', 'reconcile'));

-- One row per reconciled source: where its log was last read from, and what
-- the last run found. `watermark` is the `created` time of the newest event
-- a successful run saw, less an overlap (events are not listed in strict
-- creation order at the edge): the next run asks for events from there
-- instead of paging through the provider's whole retention again. A failed
-- run moves no watermark, so the events it did not reach are asked for again.
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
