-- Claims up to $1 due jobs of the kinds in $2 for worker $3, leasing them for $4 ms,
-- taking only jobs whose (run_after, id) comes after ($5, $6) ($5 NULL: from the
-- front).
--
-- Index: jobs_claim_idx ON jobs (run_after, id) WHERE finished_at IS NULL AND
-- NOT blocked (a job waiting behind an earlier job of its ordering key is not
-- in the index, so a long queue behind a failed head costs nothing here). The
-- ORDER BY below is exactly that index's key, so PostgreSQL walks the index from
-- ($5, $6) and stops after $1 rows; done jobs have left the table and failed or
-- cancelled ones are not in the partial index.
--
-- Processing jobs stay in the index: the claim changes no column the index
-- mentions, which is what makes it a HOT update (a heap version, no index
-- entry). The walk steps over them (status = 'pending' is a filter), and over
-- the entries of jobs that finished but that vacuum has not removed yet: when
-- a snapshot older than them is still open (a pinned MVCC horizon), those pile
-- up at the front of the index and no hint can mark them dead. The cursor
-- ($5, $6) is where the relay's previous claim ended, so a relay draining a
-- backlog starts each claim past everything it already took instead of
-- walking it again; it claims from the front ('-infinity', 0) whenever its
-- last claim came back short or a second has passed, which picks up jobs a
-- slow transaction committed behind the cursor (relay/producer.rs).
-- A relay limited to a kind that is rare next to another kind's backlog gets
-- jobs_kind_claim_idx (kind, run_after, id) instead, and sorts its few rows;
-- the planner picks by the statistics (tests/it/outbox.rs shows both plans).
--
-- Concurrency: FOR UPDATE SKIP LOCKED makes each worker lock the rows it picks
-- and skip rows another worker has locked, so two workers never claim one job
-- and neither waits on the other. The claim, the lease and attempts + 1 are one
-- statement: there is no moment where a job is locked but not yet marked.
-- Each claimed row gets a fresh lease_token from jobs_lease_token_seq: the
-- fencing token every later write of this attempt must present. A sequence
-- never hands a value out twice, so no earlier or later claim of the job, by
-- this worker or another, after a release, an operator retry or a crash, can
-- hold the same token.
--
-- Durability: async_commit turns off synchronous_commit for this statement's
-- own transaction only (set_config's third argument; the session keeps its
-- setting), so the claim commits without waiting for a WAL flush and in one
-- round trip, where BEGIN / SET LOCAL / claim / COMMIT took four. Losing a claim
-- in a server crash is harmless: the job is pending again with its attempt not
-- even counted, and a worker that had started it is fenced out when it reports,
-- since the next claim draws a token past the lost one (nextval is not rolled
-- back, and the sequence is WAL-logged ahead of the values it hands out).
WITH async_commit AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true)
),
picked AS (
    SELECT id
    FROM jobs
    WHERE finished_at IS NULL
      AND NOT blocked
      AND run_after <= now()
      AND (run_after, id) > (coalesce($5::timestamptz, '-infinity'), $6::bigint)
      AND status = 'pending'
      AND kind = ANY($2)
    ORDER BY run_after, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs AS j
SET status = 'processing',
    locked_by = $3,
    locked_at = now(),
    lease_expires_at = now() + $4 * interval '1 millisecond',
    attempts = j.attempts + 1,
    lease_token = nextval('jobs_lease_token_seq')
FROM picked, async_commit
WHERE j.id = picked.id
RETURNING j.id, j.kind, j.payload, j.attempts, j.max_attempts, j.lease_token,
          j.created_at, j.trace_context, j.run_after
