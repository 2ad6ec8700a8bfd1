-- The next batch of a bulk action: up to $10 matching jobs with id in
-- ($9, $2], in id order, locked for the rest of this batch's transaction.
-- $1 statuses the action applies to, $3..$8 the filters (as list_jobs.sql).
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
  AND ($3::text IS NULL OR status = $3)
  AND ($4::text IS NULL OR kind = $4)
  AND ($5::bigint IS NULL OR order_id = $5)
  AND ($6::text IS NULL OR last_error ILIKE $6)
  AND ($7::timestamptz IS NULL OR created_at >= $7)
  AND ($8::timestamptz IS NULL OR created_at < $8)
ORDER BY id
LIMIT $10
FOR UPDATE SKIP LOCKED
