-- Hands claimed-but-unstarted jobs ($1 ids, $2 attempts) of worker $3 back to
-- 'pending' at shutdown, without spending an attempt: the claim's attempts + 1 is
-- undone, since no effect ran.
--
-- Index: the primary key. Fenced: only rows this worker still owns at the
-- attempt it claimed are released.
UPDATE jobs AS j
SET status = 'pending',
    attempts = j.attempts - 1,
    locked_by = NULL,
    locked_at = NULL,
    lease_expires_at = NULL
FROM unnest($1::bigint[], $2::int[]) AS l(id, attempt)
WHERE j.id = l.id
  AND j.status = 'processing'
  AND j.locked_by = $3
  AND j.attempts = l.attempt
RETURNING j.id
