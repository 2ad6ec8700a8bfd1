-- How many jobs a bulk action would change: those matching the filter whose
-- status the action applies to ($1: failed for retry; pending and failed for
-- cancel), with id at most $2 (the newest job when the preview was made).
-- $3..$8 are list_jobs.sql's filters (status, kind, order id, error pattern,
-- created from, created before). Counts at most $9 rows, so the preview says
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
      AND ($3::text IS NULL OR status = $3)
      AND ($4::text IS NULL OR kind = $4)
      AND ($5::bigint IS NULL OR order_id = $5)
      AND ($6::text IS NULL OR last_error ILIKE $6)
      AND ($7::timestamptz IS NULL OR created_at >= $7)
      AND ($8::timestamptz IS NULL OR created_at < $8)
    LIMIT $9
) AS matching
