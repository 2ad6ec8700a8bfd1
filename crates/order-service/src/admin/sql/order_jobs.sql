-- Every job of one order, for its timeline, wherever it lives. Indexes:
-- jobs_order_id_idx in jobs; in the archive, jobs_done_order_id_brin of each
-- partition (order ids rise with the heap, so only a few page ranges match).
SELECT id, order_id, kind, status, attempts, max_attempts, run_after, locked_by,
       locked_at, lease_expires_at, created_at, finished_at, last_error, blocked, ordering_key,
       CASE WHEN $2 THEN NULL ELSE payload::text END AS payload
FROM jobs_all
WHERE order_id = $1
ORDER BY id
