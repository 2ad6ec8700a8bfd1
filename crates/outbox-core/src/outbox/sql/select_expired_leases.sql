-- Picks up to $1 processing jobs whose lease expired more than $2 ms ago: their
-- worker died, hung, or lost the database for longer than the lease.
--
-- Index: job_claims_expires_idx, then the primary key of jobs. No index on
-- `jobs` holds the lease (one would make every claim and heartbeat a
-- non-HOT update; see the core's migration, 2026-12-13-000001_outbox_core),
-- so the leases are found from job_claims: one row per claim statement,
-- whose expires_at is never later than the lease of a job it still holds
-- (the claim writes both alike; the heartbeat renews a row only with all its
-- jobs, extend_leases.sql). Up to $1 expired claim rows are read and their
-- jobs probed by id: the pass costs what has expired, never the backlog,
-- which the reaper does not read at all.
--
-- The margin ($2): a worker pool whose heartbeat missed a beat or two during a short
-- blip renews its leases as soon as it is back; reaping only leases expired by
-- more than the margin lets it keep that work instead of having it run twice.
--
-- Concurrency: every worker pool runs the reaper. FOR UPDATE SKIP LOCKED gives each
-- expired job to exactly one reaper, and the rows stay locked until the same
-- transaction has moved them out of 'processing' (update_reaped_jobs.sql). A
-- worker that comes back and tries to finish such a job is fenced out: the next
-- claim gives the job a new lease_token. The claim rows are locked SKIP LOCKED
-- too, so two reapers (or a reaper and a heartbeat) never wait on each other
-- there; a row another holds is read at the next pass.
--
-- Sparing: $3 are the lease tokens of the claims the reaper's own worker pool is
-- still running. Their leases run out only when its heartbeats could not reach
-- the database (an outage longer than the lease); the effects are alive, so
-- requeueing them here would only run them twice. Another worker pool's reaper may
-- still take them.
--
-- Cleanup: an expired claim row is deleted once none of its jobs is still
-- processing under its token, counting those picked here as gone (this
-- transaction moves them out of 'processing', update_reaped_jobs.sql, or
-- rolls the delete back with them). A token is never reused, so such a row
-- can never hold a lease again. A row with a job left processing here
-- (locked elsewhere, spared, beyond the $1, not yet past the margin) stays,
-- and a later pass reads it and that job again.
--
-- Every lease has a claim row: a job enters 'processing' only through
-- claim_jobs.sql, which writes it. A statement that moves a job into
-- 'processing' by hand must write one too, or no reaper ever sees that
-- lease (moving a lease earlier needs nothing: the core's trigger carries
-- it to the row).
WITH expired AS MATERIALIZED (
    SELECT c.id, c.job_ids, c.lease_tokens
    FROM job_claims AS c
    WHERE c.expires_at < now() - $2 * interval '1 millisecond'
    ORDER BY c.expires_at
    LIMIT $1
    FOR UPDATE OF c SKIP LOCKED
),
-- Leases expired past the margin and not spared, among the expired claims'
-- jobs only: = ANY keeps it a probe of the primary key per id, whatever the
-- planner guesses of the arrays' lengths. A job is taken under its current token,
-- whichever claim row named it: that token's own row has expired too, its
-- expires_at being no later than the lease.
picked AS MATERIALIZED (
    SELECT j.id, j.attempts, j.max_attempts, j.locked_by, j.lease_token, j.lease_expires_at
    FROM jobs AS j
    WHERE j.id = ANY (ARRAY(SELECT unnest(e.job_ids) FROM expired AS e))
      AND j.finished_at IS NULL
      AND NOT j.blocked
      AND j.status = 'processing'
      AND j.lease_expires_at < now() - $2 * interval '1 millisecond'
      AND NOT (j.lease_token = ANY($3::bigint[]))
    ORDER BY j.lease_expires_at
    LIMIT $1
    FOR UPDATE OF j SKIP LOCKED
),
-- A row's jobs are probed pair by pair (id, token) through the primary key;
-- NOT IN over picked is a hashed lookup (its ids are never NULL).
dropped AS (
    DELETE FROM job_claims AS c
    USING expired AS e
    WHERE c.id = e.id
      AND NOT EXISTS (
          SELECT 1
          FROM unnest(e.job_ids, e.lease_tokens) AS p(id, lease_token)
          JOIN jobs AS j ON j.id = p.id
          WHERE j.lease_token = p.lease_token
            AND j.status = 'processing'
            AND j.id NOT IN (SELECT k.id FROM picked AS k))
)
SELECT id, attempts, max_attempts, locked_by, lease_token
FROM picked
ORDER BY lease_expires_at
