-- The limits and bookkeeping of concurrency key $1 (no row: the key was
-- never used nor limited).
--
-- Index: the primary key. Read-only.
SELECT max_in_flight, per_second, paused_until, in_flight
FROM job_concurrency_keys
WHERE key = $1
