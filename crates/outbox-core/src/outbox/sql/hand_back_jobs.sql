-- Hands claimed-but-unstarted jobs ($1 ids, $2 lease tokens) back to 'pending'
-- at shutdown, without spending an attempt: the claim's attempts + 1 is undone,
-- since no effect ran. The token stays as it is: the next claim draws a new one.
--
-- Index: the primary key. Fenced: only rows still held under the token of the
-- claim being released change.
--
-- Concurrency keys: each released claim gives its key's slot back, once (the
-- fenced UPDATE returns a row only for a claim it ended), through
-- jobs_free_concurrency_slots, as finish_jobs.sql does.
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
-- The slots of the claims ended here (jobs_free_concurrency_slots, a core
-- migration); no call when none had a key.
freed AS (
    SELECT jobs_free_concurrency_slots(e.keys)
    FROM (SELECT ARRAY(SELECT concurrency_key FROM released WHERE concurrency_key IS NOT NULL) AS keys) AS e
    WHERE e.keys <> '{}'
)
SELECT id FROM released WHERE (SELECT count(*) FROM freed) >= 0
