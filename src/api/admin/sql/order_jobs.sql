-- Every job of one order, for its timeline. Index: jobs_order_id_idx.
SELECT id, order_id, kind, status, attempts, max_attempts, run_after, locked_by,
       locked_at, lease_expires_at, created_at, finished_at, last_error, blocked, ordering_key,
       CASE WHEN $2 THEN NULL ELSE payload::text END AS payload
FROM jobs
WHERE order_id = $1
ORDER BY id
