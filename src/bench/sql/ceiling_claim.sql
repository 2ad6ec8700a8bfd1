-- The ceiling's claim: the relay's claim of layout v2 with nothing around it.
-- $1 batch, $2 kinds, $3 worker, $4 lease in ms, $5 / $6 this loop's cursor
-- (the run_after and id of the last job it claimed; '-infinity' and 0 to
-- start from the front).
--
-- Index: jobs_claim_idx ON jobs (run_after, id) WHERE finished_at IS NULL AND
-- NOT blocked; the predicate below implies the index's, and the ORDER BY is
-- its key, so the scan starts at the cursor and stops after $1 rows. Claimed
-- (processing) jobs stay in that index (the claim is a HOT update and writes
-- no entry), and so do, under a pinned horizon, the entries of finished jobs
-- that cannot be cleaned yet: the cursor keeps each loop from stepping over
-- them again on every claim. A job skipped behind the cursor (locked by
-- another loop at that moment) is found when the loop, finding nothing ahead,
-- starts again from the front.
--
-- Concurrency: FOR UPDATE SKIP LOCKED, as in the relay: no two loops claim one
-- job and none waits on another. Each claim draws a fresh lease token.
-- async_commit: the claim's own transaction skips the WAL flush, as the
-- relay's does (a lost claim is a pending job again).
WITH async_commit AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true)
),
picked AS (
    SELECT id
    FROM jobs
    WHERE status = 'pending'
      AND finished_at IS NULL
      AND NOT blocked
      AND run_after <= now()
      AND kind = ANY($2)
      AND (run_after, id) > ($5, $6)
    ORDER BY run_after, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs AS j
SET status = 'processing',
    locked_by = $3,
    locked_at = now(),
    lease_expires_at = now() + $4 * interval '1 millisecond',
    attempts = j.attempts + 1,
    lease_token = nextval('jobs_lease_token_seq')
FROM picked, async_commit
WHERE j.id = picked.id
RETURNING j.id, j.run_after, j.lease_token
