-- Jobs by status, for the outbox_jobs{status} gauge, refreshed every few
-- seconds by every API and worker pool process: its cost must follow the backlog,
-- never the history of done jobs.
--
-- done: the sum of the live-row counter PostgreSQL's statistics keep for each
-- partition of jobs_done (pg_stat_get_live_tuples, what pg_stat_user_tables
-- shows as n_live_tup), one catalog lookup per partition and no row read.
-- It is an estimate: it trails commits by up to a second or so (backends
-- flush their counts when idle), and after a crash it restarts from what the
-- next VACUUM or ANALYZE finds. Only done jobs move to jobs_done today.
--
-- failed, cancelled (and done jobs finished before the worker pool moved them to
-- jobs_done): exact counts of the rows of jobs_finished_idx, which holds
-- exactly the finished rows still in jobs; reading them costs one index entry
-- and one heap visit each (or a scan of jobs when the planner finds them a
-- large share of it).
--
-- pending, processing: exact counts of the unfinished rows of jobs, in one
-- sequential scan of jobs: O(rows in jobs), that is the backlog, the failed
-- and cancelled jobs and the dead versions vacuum has not yet reclaimed, never
-- jobs_done. No index answers it for less: status is in no index (so that the
-- claim and the heartbeat stay HOT updates), and jobs_claim_idx, whose rows
-- are the unfinished ones, leaves out the jobs waiting behind their ordering
-- key, which are pending too.
--
-- Read-only, no locks beyond the planner's share locks, one snapshot.
SELECT live.pending                    AS pending,
       live.processing                 AS processing,
       archived.done + finished.done   AS done,
       finished.failed                 AS failed,
       finished.cancelled              AS cancelled
FROM (SELECT count(*) FILTER (WHERE status = 'pending')    AS pending,
             count(*) FILTER (WHERE status = 'processing') AS processing
      FROM jobs
      WHERE finished_at IS NULL) AS live,
     (SELECT count(*) FILTER (WHERE status = 'done')      AS done,
             count(*) FILTER (WHERE status = 'failed')    AS failed,
             count(*) FILTER (WHERE status = 'cancelled') AS cancelled
      FROM jobs
      WHERE finished_at IS NOT NULL) AS finished,
     (SELECT coalesce(sum(pg_stat_get_live_tuples(inhrelid)), 0)::bigint AS done
      FROM pg_inherits
      WHERE inhparent = 'jobs_done'::regclass) AS archived
