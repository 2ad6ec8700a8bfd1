-- Jobs finished per minute over the last hour: done, and failed for good.
--
-- Indexes: jobs_done_finished_at_idx and jobs_failed_finished_at_idx, each a
-- range scan of one hour of finished_at; nothing older is read.
SELECT date_trunc('minute', finished_at) AS minute,
       count(*) FILTER (WHERE status = 'done')   AS done,
       count(*) FILTER (WHERE status = 'failed') AS failed
FROM (
    SELECT finished_at, status FROM jobs
    WHERE status = 'done' AND finished_at > now() - interval '1 hour'
    UNION ALL
    SELECT finished_at, status FROM jobs
    WHERE status = 'failed' AND finished_at > now() - interval '1 hour'
) AS finished
GROUP BY 1
ORDER BY 1
