-- The jobs of one order that wait for parents (`waiting_on` not empty), for
-- its timeline. Only jobs is read: a waiting job is pending, and a pending job
-- never leaves it. Index: jobs_order_id_idx. Read-only.
SELECT id, waiting_on
FROM jobs
WHERE order_id = $1
  AND waiting_on <> '{}'
ORDER BY id
