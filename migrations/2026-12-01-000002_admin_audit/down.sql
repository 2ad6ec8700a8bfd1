DROP INDEX IF EXISTS jobs_cancelled_finished_at_idx;
DROP INDEX IF EXISTS jobs_failed_finished_at_idx;
DROP TABLE IF EXISTS admin_audit;
