-- Which of a Stripe account's modes a source takes events from: `live`,
-- `test`, or `any` (every source made before this column, and every
-- `standard` source, whose events carry no mode). A Stripe event whose
-- `livemode` says the other mode is stored `ignored`, with the reason, and
-- changes no order.
ALTER TABLE sources
    ADD COLUMN mode text NOT NULL DEFAULT 'any',
    ADD CONSTRAINT sources_mode_valid CHECK (mode IN ('live', 'test', 'any')),
    -- Standard Webhooks marks no event live or test.
    ADD CONSTRAINT sources_mode_of_kind CHECK (kind = 'stripe' OR mode = 'any');

COMMENT ON COLUMN sources.mode IS
    'live, test or any: the livemode of the Stripe events this source applies.';
