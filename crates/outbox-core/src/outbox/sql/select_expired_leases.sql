-- Picks up to $1 processing jobs whose lease expired more than $2 ms ago: their
-- worker died, hung, or lost the database for longer than the lease.
--
-- Index: none of its own. An index on the lease (or one whose predicate
-- mentions status) would make every claim and heartbeat a non-HOT update,
-- writing an entry per index per job; the layout keeps them HOT instead
-- (the core's migration, 2026-12-13-000001_outbox_core). The reaper runs every few
-- seconds, so it reads the unfinished jobs, through jobs_claim_idx (keyless
-- jobs only, so not usable here once keyed jobs exist) or a sequential scan
-- as the planner finds cheaper: O(backlog) per pass, never
-- the history, which has left for jobs_done.
--
-- The margin ($2): a worker pool whose heartbeat missed a beat or two during a short
-- blip renews its leases as soon as it is back; reaping only leases expired by
-- more than the margin lets it keep that work instead of having it run twice.
--
-- Concurrency: every worker pool runs the reaper. FOR UPDATE SKIP LOCKED gives each
-- expired job to exactly one reaper, and the rows stay locked until the same
-- transaction has moved them out of 'processing' (update_reaped_jobs.sql). A
-- worker that comes back and tries to finish such a job is fenced out: the next
-- claim gives the job a new lease_token.
--
-- Sparing: $3 are the lease tokens of the claims the reaper's own worker pool is
-- still running. Their leases run out only when its heartbeats could not reach
-- the database (an outage longer than the lease); the effects are alive, so
-- requeueing them here would only run them twice. Another worker pool's reaper may
-- still take them.
SELECT id, attempts, max_attempts, locked_by, lease_token
FROM jobs
WHERE finished_at IS NULL
  AND NOT blocked
  AND status = 'processing'
  AND lease_expires_at < now() - $2 * interval '1 millisecond'
  AND NOT (lease_token = ANY($3::bigint[]))
ORDER BY lease_expires_at
LIMIT $1
FOR UPDATE SKIP LOCKED
