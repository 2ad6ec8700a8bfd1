-- The parents ($1 ids) of jobs being enqueued: each id found with its status,
-- those still in `jobs` locked FOR KEY SHARE until the enqueuing transaction
-- ends; those in the archive come back 'done'. An id in neither does not
-- exist (or was done and moved after this statement's snapshot: the caller
-- looks for those again in a statement of its own).
--
-- Index: the primary key of `jobs`; the BRIN of jobs_done on id for the rest.
--
-- Concurrency: the lock keeps every statement that ends a parent (the
-- finish's and the reaper's FOR UPDATE SKIP LOCKED, an operator's cancel)
-- off it until the dependent is committed, so whichever ends it afterwards
-- sees the dependent and releases or cancels it; without it a parent
-- finishing meanwhile would miss a dependent it cannot see yet, which would
-- wait forever. KEY SHARE does not conflict with the heartbeat's update of
-- a running parent.
WITH live AS (
    SELECT j.id, j.status
    FROM jobs AS j
    WHERE j.id = ANY($1)
    ORDER BY j.id
    FOR KEY SHARE OF j
)
SELECT id, status FROM live
UNION ALL
SELECT d.id, d.status
FROM jobs_done AS d
WHERE d.id = ANY($1)
  AND d.id NOT IN (SELECT id FROM live)
