-- Counts by kind and status, with the age of the oldest due pending job (not
-- counting jobs blocked behind an earlier job of their ordering key: they are
-- not due until it finishes) and the number of expired leases per kind.
--
-- Reads every job, live and archived (jobs_all): a sequential scan of jobs and
-- of every partition of jobs_done. For operators (`jobs stats`) only; the
-- gauges refreshed every few seconds use queue_depth.sql, which reads no
-- archived row. Read-only.
SELECT kind,
       count(*) FILTER (WHERE status = 'pending')    AS pending,
       count(*) FILTER (WHERE status = 'processing') AS processing,
       count(*) FILTER (WHERE status = 'done')       AS done,
       count(*) FILTER (WHERE status = 'failed')     AS failed,
       count(*) FILTER (WHERE status = 'cancelled')  AS cancelled,
       count(*) FILTER (WHERE status = 'processing' AND lease_expires_at < now()) AS expired_leases,
       extract(epoch FROM now() - min(run_after) FILTER (WHERE status = 'pending' AND NOT blocked AND run_after <= now()))::float8
           AS oldest_due_pending_seconds
FROM jobs_all
GROUP BY kind
ORDER BY kind
