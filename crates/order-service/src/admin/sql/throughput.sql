-- Jobs finished per minute over the last hour: done, and failed for good.
--
-- Indexes: one hour of finished_at from each place a finished job lives:
-- jobs_finished_idx for the failed jobs (and any done job still in jobs), and
-- for the archive the partitions of jobs_done that the hour overlaps (pruned
-- by finished_at when the query starts) through jobs_done_finished_at_brin.
-- Nothing older is read.
SELECT date_trunc('minute', finished_at) AS minute,
       count(*) FILTER (WHERE status = 'done')   AS done,
       count(*) FILTER (WHERE status = 'failed') AS failed
FROM jobs_all
WHERE status IN ('done', 'failed') AND finished_at > now() - interval '1 hour'
GROUP BY 1
ORDER BY 1
