-- Relays seen recently: each worker id holding jobs now (with how many and its
-- latest claim or lease renewal), or that finished a job in the last 5 minutes.
-- A relay's heartbeat is not stored on its own, so "last seen" is the latest
-- of its claims and its completions.
--
-- Indexes: processing jobs are among the rows of jobs_claim_idx (the
-- backlog); recent completions come from jobs_all: the newest partition of
-- jobs_done (pruned by finished_at) through jobs_done_finished_at_brin, and
-- any done row still in jobs through jobs_finished_idx (five minutes of each).
SELECT locked_by AS worker,
       count(*) FILTER (WHERE status = 'processing') AS in_flight,
       count(*) FILTER (WHERE status = 'done')       AS done_5m,
       max(GREATEST(locked_at, finished_at))         AS last_seen
FROM (
    SELECT locked_by, status, locked_at, NULL::timestamptz AS finished_at FROM jobs
    WHERE finished_at IS NULL AND NOT blocked AND status = 'processing'
    UNION ALL
    SELECT locked_by, status, locked_at, finished_at FROM jobs_all
    WHERE status = 'done' AND finished_at > now() - interval '5 minutes'
) AS recent
WHERE locked_by IS NOT NULL
GROUP BY locked_by
ORDER BY last_seen DESC NULLS LAST
LIMIT 100
