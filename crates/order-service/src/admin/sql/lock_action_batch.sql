-- The next batch of a bulk action: up to $10 matching jobs with id in
-- ($9, $2], in id order, locked for the rest of this batch's transaction.
-- $1 statuses the action applies to, $3..$8 the jobs filter (job_filter.sql).
--
-- Index: the primary key, from $9 up. Only jobs is read: failed and pending
-- jobs never leave it, and done jobs are in jobs_done, so the walk passes the
-- backlog and the failed and cancelled rows, not the history.
--
-- Concurrency: SKIP LOCKED steps over rows a relay or another operator holds
-- (a relay claiming a pending job), so a batch never waits on a lock; the
-- caller's transaction is one batch, so the locks are held for milliseconds.
-- The caller moves $9 past the batch's last id, so each row is visited once.
SELECT id FROM jobs
WHERE status = ANY($1)
  AND id <= $2
  AND id > $9
  AND {job_filter}
ORDER BY id
LIMIT $10
FOR UPDATE SKIP LOCKED
