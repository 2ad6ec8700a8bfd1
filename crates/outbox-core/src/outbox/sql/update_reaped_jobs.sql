-- Moves reaped jobs ($1 ids, $2 their lease tokens) to $3 statuses ('pending'
-- with a $4 ms backoff, or 'failed' when out of attempts), with $5 as last_error.
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
WITH reaped AS (
UPDATE jobs AS j
SET status = r.status,
    run_after = CASE WHEN r.status = 'pending'
                     THEN now() + r.delay_ms * interval '1 millisecond'
                     ELSE j.run_after END,
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
RETURNING j.concurrency_key
),
ended AS (
    SELECT concurrency_key AS key, count(*) AS n
    FROM reaped
    WHERE concurrency_key IS NOT NULL
    GROUP BY concurrency_key
),
key_locks AS (
    SELECT k.key
    FROM job_concurrency_keys AS k
    WHERE k.key = ANY (ARRAY(SELECT key FROM ended))
    ORDER BY k.key
    FOR NO KEY UPDATE OF k
),
freed AS (
    UPDATE job_concurrency_keys AS k
    SET in_flight = k.in_flight - e.n
    FROM ended AS e
    WHERE k.key = e.key
      AND (SELECT count(*) FROM key_locks) >= 0
)
SELECT count(*) FROM reaped
