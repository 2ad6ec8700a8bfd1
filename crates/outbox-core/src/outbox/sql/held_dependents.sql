-- Dependents held by a failed parent (`jobs blocked`): pending jobs whose
-- `waiting_on` still names a failed job. Only policy `hold` ones stay there
-- (finish_jobs.sql and update_reaped_jobs.sql take a failed parent out of a
-- `run` dependent's `waiting_on`); one row per (dependent, failed parent),
-- oldest parent first, up to $1 rows. Read-only: a snapshot of both sides.
--
-- Index: jobs_finished_idx (the failed and cancelled rows, whose predicate
-- `finished_at IS NOT NULL` the query repeats) finds the failed parents;
-- jobs_waiting_on_idx (GIN over waiting rows) their dependents. Only jobs
-- is read: a failed parent and a waiting dependent never leave it.
SELECT d.id, d.kind, d.dependency_policy,
       p.id AS parent_id, p.kind AS parent_kind, p.status AS parent_status,
       p.last_error AS parent_error, p.finished_at AS parent_finished_at
FROM jobs AS p
JOIN jobs AS d
  ON d.waiting_on <> '{}'
 AND d.waiting_on @> ARRAY[p.id]
 AND d.status = 'pending'
WHERE p.finished_at IS NOT NULL
  AND p.status = 'failed'
ORDER BY p.id, d.id
LIMIT $1
