-- Heartbeat: extends the leases of in-flight claims ($1 ids, $2 lease tokens) to
-- now() + $3 ms, in one statement for all of them. Returns one row per claim
-- that is still held (status 'processing' with the same token), with that
-- token: a worker pool holding a stale and a current claim of one job (its own
-- claim reaped and claimed again) learns which of the two it still holds. `extended` is
-- false when another transaction had the row locked at that moment. A claim
-- with no row at all is lost: reaped, re-claimed, cancelled or finished.
--
-- Index: the primary key; the claims' rows through job_claims_locked_by_idx.
--
-- Fenced like every write to a processing job (id, status and lease_token).
-- SKIP LOCKED: a row locked elsewhere (an operator's open transaction, the
-- completer writing that very job) is skipped and reported as held but not
-- extended, instead of making the heartbeat of every other job wait behind it;
-- the next beat tries it again. The lock is re-checked against the newest row
-- version, so a claim that changed hands meanwhile is never extended.
--
-- The claim rows (job_claims) of the worker pools holding these leases: the
-- reaper reads only rows whose expires_at has passed, so a row may move only
-- as far as the leases it still holds. A row is renewed to the leases' new
-- expiry when this statement renewed every job it holds (processing under its
-- token); one holding a job not renewed here (busy, or no longer in this
-- worker pool's hands) keeps its expiry, and the reaper reads it once that
-- passes. A row that holds no job any more is deleted: a token is never
-- reused, so it never will again. Whether a row holds a job is read from
-- `jobs` itself, not from the leases given, so a claim that committed but
-- whose jobs the worker pool has not registered yet is never taken for
-- ended. Claim rows another transaction holds (a reaper's) are skipped, as
-- busy jobs are.
WITH lease AS MATERIALIZED (
    SELECT * FROM unnest($1::bigint[], $2::bigint[]) AS l(id, lease_token)
),
held AS (
    SELECT l.id, l.lease_token, j.locked_by
    FROM jobs AS j
    JOIN lease AS l ON l.id = j.id AND l.lease_token = j.lease_token
    WHERE j.id = ANY($1)
      AND j.status = 'processing'
),
-- Locks by id (a primary-key probe each), then keeps the rows whose token
-- matches; joining the unnested leases to `jobs` row by row planned as a
-- nested loop over a function scan, quadratic in the claims held.
locked AS (
    SELECT j.id, j.lease_token
    FROM jobs AS j
    WHERE j.id = ANY($1)
      AND j.status = 'processing'
    FOR NO KEY UPDATE OF j SKIP LOCKED
),
lockable AS (
    SELECT k.id
    FROM locked AS k
    JOIN lease AS l ON l.id = k.id AND l.lease_token = k.lease_token
),
extended AS (
    UPDATE jobs AS j
    SET lease_expires_at = now() + $3 * interval '1 millisecond'
    FROM lockable
    WHERE j.id = lockable.id
      AND j.status = 'processing'
    RETURNING j.id, j.lease_token
),
-- The claim rows (job_claims) of the worker pools that hold these leases,
-- through job_claims_locked_by_idx: this worker pool's own, as a rule.
claims AS MATERIALIZED (
    SELECT c.id, c.job_ids, c.lease_tokens
    FROM job_claims AS c
    WHERE c.locked_by = ANY (ARRAY(SELECT DISTINCT locked_by FROM held))
    FOR NO KEY UPDATE OF c SKIP LOCKED
),
pairs AS MATERIALIZED (
    SELECT c.id AS claim, p.id, p.lease_token
    FROM claims AS c, unnest(c.job_ids, c.lease_tokens) AS p(id, lease_token)
),
-- Per token of the claims: its claim, whether its job still runs under it,
-- and whether this statement renewed it (a token was drawn for one job
-- only, so the token alone names the pair). Then each claim's verdict. GROUP
-- BYs over unions, a hash or a sort, where a join of these CTEs would plan
-- as a nested loop (the planner guesses few rows for unnest), quadratic in
-- the jobs held.
tokens AS (
    SELECT max(t.claim) AS claim, bool_or(t.running) AS running, bool_or(t.renewed) AS renewed
    FROM (SELECT p.claim, p.lease_token, false AS running, false AS renewed FROM pairs AS p
          UNION ALL
          SELECT NULL, j.lease_token, true, false
          FROM jobs AS j
          WHERE j.id = ANY (ARRAY(SELECT id FROM pairs))
            AND j.status = 'processing'
          UNION ALL
          SELECT NULL, e.lease_token, false, true FROM extended AS e) AS t
    GROUP BY t.lease_token
),
verdict AS MATERIALIZED (
    SELECT t.claim AS id,
           count(*) FILTER (WHERE t.running) AS live,
           coalesce(bool_and(t.renewed) FILTER (WHERE t.running), false) AS renewed
    FROM tokens AS t
    WHERE t.claim IS NOT NULL
    GROUP BY t.claim
),
renewed AS (
    UPDATE job_claims AS c
    SET expires_at = now() + $3 * interval '1 millisecond'
    FROM verdict AS v
    WHERE c.id = v.id
      AND v.live > 0
      AND v.renewed
),
dropped AS (
    DELETE FROM job_claims AS c
    USING verdict AS v
    WHERE c.id = v.id
      AND v.live = 0
)
SELECT held.id, held.lease_token, (held.id IN (SELECT id FROM extended)) AS extended
FROM held
