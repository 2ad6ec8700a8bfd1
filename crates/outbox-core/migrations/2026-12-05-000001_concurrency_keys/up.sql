-- Concurrency keys: a job may name a key (`concurrency_key`), and a key may
-- carry limits (a row in `job_concurrency_keys`): at most `max_in_flight` of
-- its jobs processing, claims of its jobs at most `per_second`, none while
-- `paused_until` is ahead. A library user's "per tenant" or "per API" limit;
-- the order service's "per webhook endpoint".
--
-- Keyed jobs are claimed through their key (claim_jobs.sql): the claim walks
-- the keys that may start a job now, then each key's own index, so a
-- saturated or paused key's jobs stay `pending` and cost the claim nothing.
-- Keyless jobs keep the claim's ordered scan, on indexes that leave keyed
-- jobs out.
--
-- The service's databases get this migration too: run_migration_sets runs
-- the core's set after the service's own, and the service's history ends by
-- recording only the core's baseline as applied.

ALTER TABLE jobs ADD COLUMN concurrency_key text NULL;
ALTER TABLE jobs_done ADD COLUMN concurrency_key text NULL;

-- One row per key ever used by a keyed job (the enqueue inserts it) or
-- given a limit. The limit columns are what the application sets
-- (NULL: no such limit); the rest is the queue's own bookkeeping, written
-- only by the statements that claim a keyed job or end its claim.
CREATE TABLE job_concurrency_keys (
    key           text             PRIMARY KEY,
    max_in_flight int              NULL,
    per_second    double precision NULL,
    -- No job of the key is claimed before this time ('infinity': until the
    -- application changes it).
    paused_until  timestamptz      NULL,
    -- The key's jobs in 'processing': +1 for each claim, -1 for each claim
    -- that ends (finish, release, reap), in the statement that moves the
    -- job, under its fencing token, so each claim gives its slot back once.
    in_flight     int              NOT NULL DEFAULT 0,
    -- The token bucket of `per_second`: `tokens` as of `tokens_at` (NULL:
    -- full). It refills at per_second up to its capacity (claim_jobs.sql).
    tokens        double precision NULL,
    tokens_at     timestamptz      NOT NULL DEFAULT now(),
    -- When the claim last took a job of this key: keys are served least
    -- recently served first, so a busy key cannot starve the others.
    served_at     timestamptz      NOT NULL DEFAULT '-infinity',
    CONSTRAINT job_concurrency_keys_max_in_flight_positive
        CHECK (max_in_flight IS NULL OR max_in_flight > 0),
    CONSTRAINT job_concurrency_keys_per_second_positive
        CHECK (per_second IS NULL OR (per_second > 0 AND per_second < 'Infinity')),
    -- A slot given back twice would let a key run past its limit: fail
    -- loudly instead.
    CONSTRAINT job_concurrency_keys_in_flight_not_negative CHECK (in_flight >= 0)
);

-- The claim's walk over the keys: least recently served first.
CREATE INDEX job_concurrency_keys_served_idx ON job_concurrency_keys (served_at, key);

-- The claim's indexes leave keyed jobs out: those are claimed through their
-- key, with the index below. Still no column the claim or the heartbeat
-- writes, so both stay HOT updates.
DROP INDEX jobs_claim_idx;
DROP INDEX jobs_kind_claim_idx;
CREATE INDEX jobs_claim_idx ON jobs (run_after, id)
    WHERE finished_at IS NULL AND NOT blocked AND concurrency_key IS NULL;
CREATE INDEX jobs_kind_claim_idx ON jobs (kind, run_after, id)
    WHERE finished_at IS NULL AND NOT blocked AND concurrency_key IS NULL;
-- A key's claimable jobs in claim order.
CREATE INDEX jobs_concurrency_claim_idx ON jobs (concurrency_key, run_after, id)
    WHERE finished_at IS NULL AND NOT blocked AND concurrency_key IS NOT NULL;

-- jobs_all is every column jobs and jobs_done share, so it is rebuilt from
-- the catalog: an application's own columns (the order service's order_id)
-- stay in it.
DROP VIEW jobs_all;
DO $$
DECLARE
    columns text;
BEGIN
    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum)
    INTO columns
    FROM pg_attribute AS a
    WHERE a.attrelid = 'jobs'::regclass
      AND a.attnum > 0
      AND NOT a.attisdropped
      AND EXISTS (SELECT 1 FROM pg_attribute AS d
                  WHERE d.attrelid = 'jobs_done'::regclass
                    AND d.attname = a.attname
                    AND NOT d.attisdropped);
    EXECUTE format('CREATE VIEW jobs_all AS SELECT %1$s FROM jobs UNION ALL SELECT %1$s FROM jobs_done',
                   columns);
END $$;
