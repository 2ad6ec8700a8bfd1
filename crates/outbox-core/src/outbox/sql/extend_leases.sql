-- Heartbeat: extends the leases of in-flight claims ($1 ids, $2 lease tokens) to
-- now() + $3 ms, in one statement for all of them. Returns one row per claim
-- that is still held (status 'processing' with the same token), with that
-- token: a worker pool holding a stale and a current claim of one job (its own
-- claim reaped and claimed again) learns which of the two it still holds. `extended` is
-- false when another transaction had the row locked at that moment. A claim
-- with no row at all is lost: reaped, re-claimed, cancelled or finished.
--
-- Index: the primary key.
--
-- Fenced like every write to a processing job (id, status and lease_token).
-- SKIP LOCKED: a row locked elsewhere (an operator's open transaction, the
-- completer writing that very job) is skipped and reported as held but not
-- extended, instead of making the heartbeat of every other job wait behind it;
-- the next beat tries it again. The lock is re-checked against the newest row
-- version, so a claim that changed hands meanwhile is never extended.
WITH lease AS MATERIALIZED (
    SELECT * FROM unnest($1::bigint[], $2::bigint[]) AS l(id, lease_token)
),
held AS (
    SELECT l.id, l.lease_token
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
    RETURNING j.id
)
SELECT held.id, held.lease_token, (held.id IN (SELECT id FROM extended)) AS extended
FROM held
