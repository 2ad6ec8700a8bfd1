-- One page of the jobs page, newest first, keyset-paginated by id, over jobs
-- and the archive of done jobs (jobs_done).
-- $1 exclusive upper id (the cursor), $2 inclusive lower id (the window floor),
-- $3 status, $4 kind, $5 order id, $6 ILIKE pattern on last_error,
-- $7 created at or after, $8 created before, $9 page size, $10 hide payloads.
-- NULL filters match everything (the plan is made with the actual values, so
-- a NULL's branch folds away).
--
-- Bounded work: the caller sets the window $2..$1 to at most 50,000 ids when
-- no index narrows the search (status done or pending, kind, error text, time);
-- then the query reads at most that many ids of each place: a range of jobs'
-- primary key, and of each jobs_done partition the page ranges its BRIN index
-- on id matches (ids rise with the archive's heap), whatever the history's
-- size; the page offers "search older". With status failed or
-- processing (rows of jobs only), or an order id (jobs_order_id_idx and
-- jobs_done_order_id_brin), the window is the whole id range.
--
-- The archive holds only done jobs (layout v2): for any other status its
-- branch is a constant false and is not read at all.
--
-- Read-only, under the dashboard's statement_timeout.
SELECT id, order_id, kind, status, attempts, max_attempts, run_after, locked_by,
       locked_at, lease_expires_at, created_at, finished_at, last_error, blocked, ordering_key,
       payload
FROM (
    SELECT id, order_id, kind, status, attempts, max_attempts, run_after, locked_by,
           locked_at, lease_expires_at, created_at, finished_at, last_error, blocked,
           ordering_key, CASE WHEN $10 THEN NULL ELSE payload::text END AS payload
    FROM jobs
    WHERE id < $1
      AND id >= $2
      AND ($3::text IS NULL OR status = $3)
      AND ($4::text IS NULL OR kind = $4)
      AND ($5::bigint IS NULL OR order_id = $5)
      AND ($6::text IS NULL OR last_error ILIKE $6)
      AND ($7::timestamptz IS NULL OR created_at >= $7)
      AND ($8::timestamptz IS NULL OR created_at < $8)
    UNION ALL
    SELECT id, order_id, kind, status, attempts, max_attempts, run_after, locked_by,
           locked_at, lease_expires_at, created_at, finished_at, last_error, blocked,
           ordering_key, CASE WHEN $10 THEN NULL ELSE payload::text END AS payload
    FROM jobs_done
    WHERE ($3::text IS NULL OR $3::text = 'done')
      AND id < $1
      AND id >= $2
      AND ($4::text IS NULL OR kind = $4)
      AND ($5::bigint IS NULL OR order_id = $5)
      AND ($6::text IS NULL OR last_error ILIKE $6)
      AND ($7::timestamptz IS NULL OR created_at >= $7)
      AND ($8::timestamptz IS NULL OR created_at < $8)
) AS found
ORDER BY id DESC
LIMIT $9
