-- Records the outcomes of many jobs at once for worker $6.
-- $1 ids, $2 attempts (fencing tokens), $3 new statuses ('done', 'pending' for a
-- retry, 'failed'), $4 retry delays in ms (used for 'pending'), $5 errors (NULL
-- keeps last_error as it was).
--
-- Index: the primary key (j.id = o.id).
--
-- Fencing: a row changes only while it is still 'processing', owned by $6 and at
-- the attempt this worker claimed. If the lease was reaped and the job claimed
-- again (attempts moved on) or finished by someone else, the row does not match
-- and is left alone; RETURNING tells the caller which outcomes landed, and the
-- rest are counted as lost leases. Rows that do not match are never locked, so a
-- zombie's late batch cannot deadlock with the job's new owner.
UPDATE jobs AS j
SET status = o.status,
    run_after = CASE WHEN o.status = 'pending'
                     THEN now() + o.delay_ms * interval '1 millisecond'
                     ELSE j.run_after END,
    finished_at = CASE WHEN o.status = 'pending' THEN NULL ELSE now() END,
    last_error = COALESCE(o.error, j.last_error),
    locked_by = CASE WHEN o.status = 'pending' THEN NULL ELSE j.locked_by END,
    locked_at = CASE WHEN o.status = 'pending' THEN NULL ELSE j.locked_at END,
    lease_expires_at = NULL
FROM unnest($1::bigint[], $2::int[], $3::text[], $4::bigint[], $5::text[])
     AS o(id, attempt, status, delay_ms, error)
WHERE j.id = o.id
  AND j.status = 'processing'
  AND j.locked_by = $6
  AND j.attempts = o.attempt
RETURNING j.id
