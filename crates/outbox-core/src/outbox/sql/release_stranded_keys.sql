-- Releases the blocked head of every ordering key whose earlier jobs have all
-- ended: the safety net for the one interleaving the finishing statement
-- cannot see. finish_jobs.sql releases a key's next job with its statement
-- snapshot; an enqueue behind that key which commits after the snapshot was
-- taken but before the finish locks the head row (the enqueue's FOR SHARE
-- lock is gone by then, so SKIP LOCKED does not report the head busy) is
-- invisible to it, and its job would stay blocked with nothing ahead of it.
-- The reaper runs this every pass, so such a job waits one reap interval,
-- never forever. Up to $1 keys; returns the jobs released.
--
-- Safe beside enqueues and finishes: enqueues behind one key are serialised
-- by its advisory lock and commit in id order, so a snapshot that sees a
-- blocked job sees every earlier job of its key; a finish that releases the
-- same job first leaves `n.blocked` false, which the row's re-check after
-- the lock wait finds, and this changes nothing.
--
-- Index: jobs_ordering_key_idx (keyed rows only) for the blocked keys and
-- for each key's head.
UPDATE jobs AS n
SET blocked = false
FROM (SELECT DISTINCT b.ordering_key AS key
      FROM jobs AS b
      WHERE b.ordering_key IS NOT NULL
        AND b.blocked
      LIMIT $1) AS k
WHERE n.id = (SELECT m.id
              FROM jobs AS m
              WHERE m.ordering_key = k.key
                AND m.status IN ('pending', 'processing', 'failed')
              ORDER BY m.id
              LIMIT 1)
  AND n.blocked
RETURNING n.id
