-- Sets the limits of concurrency key $1 (NULL: no such limit), creating its
-- row if no job has used the key yet: $2 max_in_flight, $3 per_second, $4
-- paused_until.
--
-- Index: the primary key. Concurrency: the upsert locks the key's row for the
-- rest of the caller's transaction, so it waits for a claim of the key's jobs
-- to commit (a claim holds the row for one statement) and a claim after it
-- sees the new limits. The bookkeeping (in_flight, the token bucket) is left
-- alone: a lower max_in_flight lets running jobs finish and holds back new
-- claims until the key is under it.
INSERT INTO job_concurrency_keys (key, max_in_flight, per_second, paused_until)
VALUES ($1, $2, $3, $4)
ON CONFLICT (key) DO UPDATE
SET max_in_flight = excluded.max_in_flight,
    per_second = excluded.per_second,
    paused_until = excluded.paused_until
