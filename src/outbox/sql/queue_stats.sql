-- Counts by kind and status, with the age of the oldest due pending job (not
-- counting jobs blocked behind an earlier job of their ordering key: they are
-- not due until it finishes) and the number of expired leases per kind. Read-only; a sequential scan on a large
-- table, so it is for operators and the metrics cache, not for a hot loop.
SELECT kind,
       count(*) FILTER (WHERE status = 'pending')    AS pending,
       count(*) FILTER (WHERE status = 'processing') AS processing,
       count(*) FILTER (WHERE status = 'done')       AS done,
       count(*) FILTER (WHERE status = 'failed')     AS failed,
       count(*) FILTER (WHERE status = 'cancelled')  AS cancelled,
       count(*) FILTER (WHERE status = 'processing' AND lease_expires_at < now()) AS expired_leases,
       extract(epoch FROM now() - min(run_after) FILTER (WHERE status = 'pending' AND NOT blocked AND run_after <= now()))::float8
           AS oldest_due_pending_seconds
FROM jobs
GROUP BY kind
ORDER BY kind
