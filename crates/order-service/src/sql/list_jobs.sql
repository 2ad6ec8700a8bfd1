-- A page of jobs, newest first, keyset-paginated by id, over jobs and the
-- archive of done jobs (jobs_done): the dashboard's jobs page and `jobs list`.
-- $1 exclusive upper id (the cursor), $2 inclusive lower id (the window floor),
-- $3..$8 the jobs filter (job_filter.sql), $9 page size, $10 hide payloads.
--
-- Bounded work: the caller narrows the window $2..$1 when no index narrows
-- the search (status done or pending, kind, error text, time): the dashboard
-- to SEARCH_WINDOW ids, `jobs list` to windows that widen; then the query
-- reads at most that many ids of each place: a range of jobs' primary key,
-- and of each jobs_done partition the page ranges its BRIN index on id
-- matches (ids rise with the archive's heap), whatever the history's size.
-- With status failed or processing (rows of jobs only), or an order id
-- (jobs_order_id_idx and jobs_done_order_id_brin), the window is the whole
-- id range.
--
-- The archive holds only done jobs (layout v2): for any other status its
-- branch is a constant false and is not read at all.
--
-- Read-only.
SELECT id, order_id, kind, status, attempts, max_attempts, run_after, locked_by,
       locked_at, lease_expires_at, created_at, finished_at, last_error, blocked, ordering_key,
       waiting_on, payload
FROM (
    SELECT id, order_id, kind, status, attempts, max_attempts, run_after, locked_by,
           locked_at, lease_expires_at, created_at, finished_at, last_error, blocked,
           ordering_key, waiting_on, CASE WHEN $10 THEN NULL ELSE payload::text END AS payload
    FROM jobs
    WHERE id < $1
      AND id >= $2
      AND {job_filter}
    UNION ALL
    SELECT id, order_id, kind, status, attempts, max_attempts, run_after, locked_by,
           locked_at, lease_expires_at, created_at, finished_at, last_error, blocked,
           ordering_key, waiting_on, CASE WHEN $10 THEN NULL ELSE payload::text END AS payload
    FROM jobs_done
    WHERE ($3::text IS NULL OR $3::text = 'done')
      AND id < $1
      AND id >= $2
      AND {job_filter}
) AS found
ORDER BY id DESC
LIMIT $9
