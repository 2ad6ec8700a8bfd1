-- Heartbeat: extends the leases of worker $4's in-flight jobs ($1 ids, $2 attempts)
-- to now() + $3 ms, in one statement for all of them.
--
-- Index: the primary key.
--
-- Fenced like every write to a processing job: a job whose lease was already
-- reaped, or that was claimed again by another worker, is not touched, and its
-- id is missing from RETURNING, which tells the relay the lease is lost.
UPDATE jobs AS j
SET lease_expires_at = now() + $3 * interval '1 millisecond'
FROM unnest($1::bigint[], $2::int[]) AS l(id, attempt)
WHERE j.id = l.id
  AND j.status = 'processing'
  AND j.locked_by = $4
  AND j.attempts = l.attempt
RETURNING j.id
