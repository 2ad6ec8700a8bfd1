-- A job's parents (the ids in its depends_on, $2) and its children (the jobs
-- whose depends_on holds it, $1), wherever they live, for its page.
-- `waiting`: for a parent, whether the job still waits for it; for a child,
-- whether the child still waits for the job.
--
-- Index: the parents by primary key (jobs_done_id_brin in the archive); the
-- children through jobs_depends_on_idx and jobs_done_depends_on_idx (GIN over
-- depends_on). Read-only, under the dashboard's statement_timeout; at most
-- $3 children.
(SELECT 'parent' AS relation, id, kind, status, order_id, id = ANY ($4::bigint[]) AS waiting
 FROM jobs_all
 WHERE id = ANY ($2::bigint[])
 ORDER BY id)
UNION ALL
(SELECT 'child' AS relation, id, kind, status, order_id, $1 = ANY (waiting_on) AS waiting
 FROM jobs_all
 WHERE depends_on @> ARRAY[$1::bigint]
 ORDER BY id
 LIMIT $3)
