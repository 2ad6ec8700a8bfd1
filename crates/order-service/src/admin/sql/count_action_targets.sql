-- How many jobs a bulk action would change: those matching the filter whose
-- status the action applies to ($1: failed for retry; pending and failed for
-- cancel), with id at most $2 (the newest job when the preview was made).
-- $3..$8 are the jobs filter (job_filter.sql). Counts at most $9 rows, so the preview says
-- "more than N" rather than counting a huge backlog.
--
-- Reads jobs only: failed and pending jobs never leave it, and it holds no
-- history of done jobs (they are in jobs_done), so the walk is bounded by the
-- backlog and the failed and cancelled rows. No index is keyed on status (the
-- claim would not be a HOT update otherwise). Read-only.
SELECT count(*) AS n FROM (
    SELECT 1 FROM jobs
    WHERE status = ANY($1)
      AND id <= $2
      AND {job_filter}
    LIMIT $9
) AS matching
