-- The parents ($1 ids) of jobs being enqueued: each id found with its status.
-- Those still in `jobs` are marked `has_dependents` (a new version of each
-- row, locked until the enqueuing transaction ends); those in the archive
-- come back 'done'. An id in neither does not exist (or was done and moved
-- after this statement's snapshot: the caller looks for those again in a
-- statement of its own).
--
-- Index: the primary key of `jobs`; the BRIN of jobs_done on id for the rest.
--
-- Concurrency: the lock keeps every statement that ends a parent (the
-- finish's and the reaper's FOR UPDATE SKIP LOCKED, an operator's cancel)
-- off it until the dependent is committed, so whichever ends it afterwards
-- sees the dependent and releases or cancels it; without it a parent
-- finishing meanwhile would miss a dependent it cannot see yet, which would
-- wait forever. The new version closes the window after the lock: a finish
-- whose snapshot was taken before this commits, and which locks the parent
-- only after it, cannot see the dependent, and it cannot see the version
-- this wrote either, so it writes nothing and answers the parent busy
-- (finish_jobs.sql); its next statement sees both. Rows are locked in id
-- order, so two enqueues naming the same parents cannot deadlock. The
-- heartbeat skips a running parent locked here (extend_leases.sql) until the
-- enqueuing transaction ends: one open longer than the parent's lease lets
-- the lease lapse, and the reaper takes the parent back.
WITH live AS (
    SELECT j.id
    FROM jobs AS j
    WHERE j.id = ANY($1)
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
),
marked AS (
    UPDATE jobs AS j
    SET has_dependents = true
    FROM live
    WHERE j.id = live.id
    RETURNING j.id, j.status
)
SELECT id, status FROM marked
UNION ALL
SELECT d.id, d.status
FROM jobs_done AS d
WHERE d.id = ANY($1)
  AND d.id NOT IN (SELECT id FROM live)
