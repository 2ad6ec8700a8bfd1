-- Hands claimed-but-unstarted jobs ($1 ids, $2 lease tokens) back to 'pending'
-- at shutdown, without spending an attempt: the claim's attempts + 1 is undone,
-- since no effect ran. The token stays as it is: the next claim draws a new one.
--
-- Index: the primary key. Fenced: only rows still held under the token of the
-- claim being released change.
--
-- Concurrency keys: each released claim gives its key's slot back, once (the
-- fenced UPDATE returns a row only for a claim it ended); the key rows are
-- locked in key order, as in finish_jobs.sql, so this cannot deadlock with a
-- completer or a reaper freeing the same keys.
WITH released AS (
UPDATE jobs AS j
SET status = 'pending',
    attempts = j.attempts - 1,
    locked_by = NULL,
    locked_at = NULL,
    lease_expires_at = NULL
FROM unnest($1::bigint[], $2::bigint[]) AS l(id, lease_token)
WHERE j.id = l.id
  AND j.id = ANY($1)
  AND j.status = 'processing'
  AND j.lease_token = l.lease_token
RETURNING j.id, j.concurrency_key
),
ended AS (
    SELECT concurrency_key AS key, count(*) AS n
    FROM released
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
SELECT id FROM released
