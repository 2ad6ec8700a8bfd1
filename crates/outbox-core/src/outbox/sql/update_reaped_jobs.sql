-- Moves reaped jobs ($1 ids, $2 their lease tokens) to $3 statuses ('pending'
-- with a $4 ms backoff, or 'failed' when out of attempts), with $5 as last_error.
-- $6 is the channel to NOTIFY when a dependent becomes claimable.
--
-- Index: the primary key. Runs in the reaper's transaction, which holds the row
-- locks taken by select_expired_leases.sql; the status and token guard only
-- restate what those locks already guarantee.
--
-- Concurrency keys: each reaped claim gives its key's slot back, once: the
-- row leaves 'processing' under this claim's token here, so the zombie's
-- late finish (fenced by the token) ends nothing and frees nothing. The key
-- rows are locked in key order, as in finish_jobs.sql, so this cannot
-- deadlock with a completer freeing the same keys. Returns how many it moved
-- (one row, not one per job: the caller needs none of them).
--
-- Dependencies: a reaped job that ends 'failed' releases its dependents of
-- policy 'run' (noted in their `unfinished_parents`) as finish_jobs.sql
-- does, locking them in id order first; those of policy 'hold' keep waiting
-- until an operator retries it.
WITH reaped AS (
UPDATE jobs AS j
SET status = r.status,
    run_after = jobs_run_again_at(r.status, r.delay_ms, j.run_after),
    finished_at = CASE WHEN r.status = 'pending' THEN NULL ELSE now() END,
    last_error = r.error,
    locked_by = NULL,
    locked_at = NULL,
    lease_expires_at = NULL
FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::bigint[], $5::text[])
     AS r(id, lease_token, status, delay_ms, error)
WHERE j.id = r.id
  AND j.id = ANY($1)
  AND j.status = 'processing'
  AND j.lease_token = r.lease_token
RETURNING j.id, j.status, j.concurrency_key
),
failed_parents AS MATERIALIZED (
    SELECT ARRAY(SELECT id FROM reaped WHERE status = 'failed') AS failed
),
targets AS (
    SELECT c.id
    FROM jobs AS c, failed_parents AS f
    WHERE c.waiting_on <> '{}'
      AND c.waiting_on && f.failed
      AND c.dependency_policy = 'run'
      AND c.status = 'pending'
    ORDER BY c.id
    FOR NO KEY UPDATE OF c
),
released AS (
    UPDATE jobs AS n
    SET waiting_on = ARRAY(SELECT p FROM unnest(n.waiting_on) AS p WHERE p <> ALL (f.failed)),
        unfinished_parents = coalesce(n.unfinished_parents, '{}')
            || ARRAY(SELECT p FROM unnest(n.waiting_on) AS p WHERE p = ANY (f.failed))
    FROM failed_parents AS f
    WHERE n.id = ANY (ARRAY(SELECT id FROM targets))
      AND n.waiting_on && f.failed
    RETURNING n.kind, n.waiting_on, n.blocked
),
woken AS (
    SELECT pg_notify($6, k.kind)
    FROM (SELECT DISTINCT r.kind FROM released AS r
          WHERE r.waiting_on = '{}' AND NOT r.blocked) AS k
),
-- The slots of the claims ended here (jobs_free_concurrency_slots, a core
-- migration); no call when none had a key.
freed AS (
    SELECT jobs_free_concurrency_slots(e.keys)
    FROM (SELECT ARRAY(SELECT concurrency_key FROM reaped WHERE concurrency_key IS NOT NULL) AS keys) AS e
    WHERE e.keys <> '{}'
)
SELECT count(*) FROM reaped
WHERE (SELECT count(*) FROM woken) >= 0
  AND (SELECT count(*) FROM freed) >= 0
