-- Dependencies: a job may wait for other jobs (its parents) before it is
-- claimable. The finish that marks a parent done takes it out of each
-- dependent's `waiting_on` in the same statement (finish_jobs.sql); a
-- dependent whose `waiting_on` is empty is an ordinary pending job.
--
-- Jobs without parents pay nothing beyond an empty array: the claim's
-- indexes gain the predicate `waiting_on = '{}'`, which the claim repeats,
-- and the dependents' indexes below hold only rows that have parents.

-- The ids of the parents this job still waits for: not done yet, or (policy
-- `hold`) failed. Empty when it waits for none.
ALTER TABLE jobs ADD COLUMN waiting_on bigint[] NOT NULL DEFAULT '{}';
-- Every parent the job was enqueued with, for display (NULL: none).
ALTER TABLE jobs ADD COLUMN depends_on bigint[] NULL;
-- What a parent that does not end done does to this job: 'hold' (a failed
-- parent holds it until retried; a cancelled one cancels it) or 'run' (it
-- runs anyway). NULL for a job without parents.
ALTER TABLE jobs ADD COLUMN dependency_policy text NULL;
-- Policy 'run': the parents that ended failed or cancelled, which the worker
-- is told about (JobContext::unfinished_parents).
ALTER TABLE jobs ADD COLUMN unfinished_parents bigint[] NULL;
ALTER TABLE jobs ADD CONSTRAINT jobs_dependency_policy_valid
    CHECK (dependency_policy IS NULL OR dependency_policy IN ('hold', 'run'));
ALTER TABLE jobs ADD CONSTRAINT jobs_waiting_has_parents
    CHECK (waiting_on = '{}' OR (depends_on IS NOT NULL AND dependency_policy IS NOT NULL));

ALTER TABLE jobs_done ADD COLUMN waiting_on bigint[] NOT NULL DEFAULT '{}';
ALTER TABLE jobs_done ADD COLUMN depends_on bigint[] NULL;
ALTER TABLE jobs_done ADD COLUMN dependency_policy text NULL;
ALTER TABLE jobs_done ADD COLUMN unfinished_parents bigint[] NULL;

-- The claim's indexes leave waiting jobs out, as they leave blocked ones
-- out. Still no column the claim or the heartbeat writes: both stay HOT.
DROP INDEX jobs_claim_idx;
DROP INDEX jobs_kind_claim_idx;
DROP INDEX jobs_concurrency_claim_idx;
CREATE INDEX jobs_claim_idx ON jobs (run_after, id)
    WHERE finished_at IS NULL AND NOT blocked AND concurrency_key IS NULL AND waiting_on = '{}';
CREATE INDEX jobs_kind_claim_idx ON jobs (kind, run_after, id)
    WHERE finished_at IS NULL AND NOT blocked AND concurrency_key IS NULL AND waiting_on = '{}';
CREATE INDEX jobs_concurrency_claim_idx ON jobs (concurrency_key, run_after, id)
    WHERE finished_at IS NULL AND NOT blocked AND concurrency_key IS NOT NULL AND waiting_on = '{}';

-- The dependents a finishing parent releases: only waiting rows are in it,
-- so a finish whose jobs have no dependents probes an index without entries
-- for them, and an enqueue without parents adds no entry.
CREATE INDEX jobs_waiting_on_idx ON jobs USING gin (waiting_on) WHERE waiting_on <> '{}';
-- A job's children, wherever they are (the dashboard's job page).
CREATE INDEX jobs_depends_on_idx ON jobs USING gin (depends_on) WHERE depends_on IS NOT NULL;
CREATE INDEX jobs_done_depends_on_idx ON jobs_done USING gin (depends_on)
    WHERE depends_on IS NOT NULL;

-- jobs_all gains the new columns, rebuilt from the catalog as before so an
-- application's own columns stay in it.
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
