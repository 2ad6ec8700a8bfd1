-- Heartbeat: extends the leases of in-flight claims ($1 ids, $2 lease tokens) to
-- now() + $3 ms, in one statement for all of them. Returns one row per claim
-- that is still held (status 'processing' with the same token): `extended` is
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
WITH lease AS (
    SELECT * FROM unnest($1::bigint[], $2::bigint[]) AS l(id, lease_token)
),
held AS (
    SELECT j.id
    FROM jobs AS j
    JOIN lease AS l ON j.id = l.id AND j.lease_token = l.lease_token
    WHERE j.status = 'processing'
),
lockable AS (
    SELECT j.id
    FROM jobs AS j
    JOIN lease AS l ON j.id = l.id AND j.lease_token = l.lease_token
    WHERE j.status = 'processing'
    FOR NO KEY UPDATE OF j SKIP LOCKED
),
extended AS (
    UPDATE jobs AS j
    SET lease_expires_at = now() + $3 * interval '1 millisecond'
    FROM lockable
    WHERE j.id = lockable.id
      AND j.status = 'processing'
    RETURNING j.id
)
SELECT held.id, (extended.id IS NOT NULL) AS extended
FROM held
LEFT JOIN extended ON extended.id = held.id
