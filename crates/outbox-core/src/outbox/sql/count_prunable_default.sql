-- How many done jobs in jobs_done_default finished before now() - $1 ms: the
-- rows prune_done_default.sql would delete. Read-only; a short scan of the
-- default partition, which holds only the rare rows of days that had no
-- partition.
SELECT count(*) AS n
FROM jobs_done_default
WHERE finished_at < now() - $1 * interval '1 millisecond'
