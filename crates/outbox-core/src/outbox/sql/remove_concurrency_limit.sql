-- Lifts every limit of concurrency key $1: its jobs are claimed as keyless
-- ones are. The row stays (it counts the key's processing jobs, which still
-- give their slots back when they end), with its limits NULL.
--
-- Index: the primary key. Concurrency: as set_concurrency_limit.sql.
UPDATE job_concurrency_keys
SET max_in_flight = NULL,
    per_second = NULL,
    paused_until = NULL
WHERE key = $1
