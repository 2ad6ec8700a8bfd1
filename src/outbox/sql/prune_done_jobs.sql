-- Deletes up to $2 done jobs that finished before now() - $1 ms; returns how
-- many it deleted, so the caller loops until a batch comes back short.
--
-- Index: jobs_done_finished_at_idx ON jobs (finished_at) WHERE status = 'done'.
--
-- Each batch is its own short transaction: pruning millions of rows never holds
-- a long lock or a long-running snapshot. SKIP LOCKED keeps it off any row a
-- concurrent statement is touching (none should be: done is terminal).
WITH doomed AS (
    SELECT id
    FROM jobs
    WHERE status = 'done'
      AND finished_at < now() - $1 * interval '1 millisecond'
    ORDER BY finished_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM jobs AS j
USING doomed
WHERE j.id = doomed.id
