-- The dependents of the jobs just cancelled ($1 ids): those of policy 'hold'
-- are cancelled too, `last_error` naming the parent; those of policy 'run'
-- no longer wait for it and note it in `unfinished_parents`, and when that
-- was their last parent a NOTIFY on channel $2 (delivered at the commit)
-- wakes the worker pools of their kind. Returns each dependent changed, its new
-- status and ordering key: the caller releases the keys of those cancelled
-- and runs this again for them (a cancelled dependent cancels its own).
--
-- Index: jobs_waiting_on_idx, which holds only waiting rows.
--
-- Concurrency: the dependents are locked in id order first, as the finish
-- locks them, so the two cannot deadlock; the update recomputes each array
-- from the row it locked (a parent that finished meanwhile is gone from it).
-- A cancelled dependent waits for nothing any more: its `waiting_on` is
-- emptied, which takes it out of jobs_waiting_on_idx (`depends_on` keeps
-- its parents).
WITH targets AS (
    SELECT c.id
    FROM jobs AS c
    WHERE c.waiting_on <> '{}'
      AND c.waiting_on && $1::bigint[]
      AND c.status = 'pending'
    ORDER BY c.id
    FOR NO KEY UPDATE OF c
),
changed AS (
    UPDATE jobs AS n
    SET status = CASE WHEN n.dependency_policy = 'run' THEN n.status ELSE 'cancelled' END,
        finished_at = CASE WHEN n.dependency_policy = 'run' THEN n.finished_at ELSE now() END,
        blocked = n.blocked AND n.dependency_policy = 'run',
        last_error = CASE WHEN n.dependency_policy = 'run' THEN n.last_error
                          ELSE 'parent job '
                               || (SELECT min(p) FROM unnest(n.waiting_on) AS p WHERE p = ANY ($1))
                               || ' was cancelled' END,
        waiting_on = CASE WHEN n.dependency_policy = 'run'
                          THEN ARRAY(SELECT p FROM unnest(n.waiting_on) AS p WHERE p <> ALL ($1))
                          ELSE '{}' END,
        unfinished_parents = CASE WHEN n.dependency_policy = 'run'
                                  THEN coalesce(n.unfinished_parents, '{}')
                                       || ARRAY(SELECT p FROM unnest(n.waiting_on) AS p
                                                WHERE p = ANY ($1))
                                  ELSE n.unfinished_parents END
    WHERE n.id = ANY (ARRAY(SELECT id FROM targets))
      AND n.status = 'pending'
      AND n.waiting_on && $1::bigint[]
    RETURNING n.id, n.kind, n.status, n.ordering_key, n.waiting_on, n.blocked
),
woken AS (
    SELECT pg_notify($2, k.kind)
    FROM (SELECT DISTINCT c.kind FROM changed AS c
          WHERE c.status = 'pending' AND c.waiting_on = '{}' AND NOT c.blocked) AS k
)
SELECT id, status, ordering_key
FROM changed
WHERE (SELECT count(*) FROM woken) >= 0
