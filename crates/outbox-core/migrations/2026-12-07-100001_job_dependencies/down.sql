DROP VIEW jobs_all;
DROP INDEX jobs_done_depends_on_idx;
DROP INDEX jobs_depends_on_idx;
DROP INDEX jobs_waiting_on_idx;
DROP INDEX jobs_claim_idx;
DROP INDEX jobs_kind_claim_idx;
DROP INDEX jobs_concurrency_claim_idx;
CREATE INDEX jobs_claim_idx ON jobs (run_after, id)
    WHERE finished_at IS NULL AND NOT blocked AND concurrency_key IS NULL;
CREATE INDEX jobs_kind_claim_idx ON jobs (kind, run_after, id)
    WHERE finished_at IS NULL AND NOT blocked AND concurrency_key IS NULL;
CREATE INDEX jobs_concurrency_claim_idx ON jobs (concurrency_key, run_after, id)
    WHERE finished_at IS NULL AND NOT blocked AND concurrency_key IS NOT NULL;
ALTER TABLE jobs DROP CONSTRAINT jobs_waiting_has_parents;
ALTER TABLE jobs DROP CONSTRAINT jobs_dependency_policy_valid;
ALTER TABLE jobs_done DROP COLUMN unfinished_parents;
ALTER TABLE jobs_done DROP COLUMN dependency_policy;
ALTER TABLE jobs_done DROP COLUMN depends_on;
ALTER TABLE jobs_done DROP COLUMN waiting_on;
ALTER TABLE jobs DROP COLUMN unfinished_parents;
ALTER TABLE jobs DROP COLUMN dependency_policy;
ALTER TABLE jobs DROP COLUMN depends_on;
ALTER TABLE jobs DROP COLUMN waiting_on;
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
