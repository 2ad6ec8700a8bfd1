-- Cancels the jobs with ids in $1 that are not finished: 'pending' or 'failed'
-- become 'cancelled', finished now. Returns the ids it changed and their
-- ordering keys: the caller then releases the next job of each key
-- (advance_ordering_keys.sql, as its own statement, so its snapshot sees the
-- cancellations and every enqueue committed before).
--
-- Index: the primary key (id = ANY($1)); callers pass at most CANCEL_BATCH ids,
-- so one statement locks a bounded number of rows for a short time.
--
-- Concurrency: a 'processing' job is left alone. Its worker may be half-way
-- through the effect (a message on the wire); cancelling under it would record
-- "cancelled" for a job whose effect happened. The status guard is re-checked
-- on each row after any concurrent update commits, so a job claimed between the
-- caller's look and this statement is skipped, not cancelled; and a job whose
-- status is already terminal is never touched. The lease columns are cleared
-- (a cancelled job has no owner); lease_token is kept as the record of the last
-- claim, like a finished job's. A cancelled job no longer waits on its key, so
-- `blocked` is cleared (jobs_blocked_is_a_waiting_keyed_job requires it).
UPDATE jobs
SET status = 'cancelled',
    finished_at = now(),
    locked_by = NULL,
    locked_at = NULL,
    lease_expires_at = NULL,
    blocked = false
WHERE id = ANY($1)
  AND status IN ('pending', 'failed')
RETURNING id, ordering_key
