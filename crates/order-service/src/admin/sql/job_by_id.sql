-- One job for its page, wherever it lives, with its dependency columns.
-- Index: jobs' primary key; in the archive, jobs_done_id_brin of each
-- partition. Read-only, under the dashboard's statement_timeout.
SELECT id, order_id, kind, status, attempts, max_attempts, run_after, locked_by,
       locked_at, lease_expires_at, created_at, finished_at, last_error, blocked, ordering_key,
       CASE WHEN $2 THEN NULL ELSE payload::text END AS payload,
       waiting_on, depends_on, dependency_policy, unfinished_parents
FROM jobs_all
WHERE id = $1
