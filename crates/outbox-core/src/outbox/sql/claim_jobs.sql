-- Claims up to $1 due jobs of the kinds in $2 for worker $3, leasing them for $4 ms,
-- taking only keyless jobs whose (run_after, id) comes after ($5, $6) ($5 NULL:
-- from the front), and keyed jobs (a concurrency_key) only as their key's
-- limits allow.
--
-- Index: jobs_claim_idx ON jobs (run_after, id) WHERE finished_at IS NULL AND
-- NOT blocked AND concurrency_key IS NULL AND waiting_on = '{}' (a job waiting
-- behind an earlier job of its ordering key, or for its parents, is not in the
-- index, so a long queue behind a failed head or a fan-out waiting for its
-- parent costs nothing here; the WHERE repeats the predicate so the planner
-- may use it). The
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
-- ($5, $6) is where the worker pool's previous claim ended, so a worker pool draining a
-- backlog starts each claim past everything it already took instead of
-- walking it again; it claims from the front ('-infinity', 0) whenever its
-- last claim came back short or a second has passed, which picks up jobs a
-- slow transaction committed behind the cursor (worker_pool/producer.rs).
-- A worker pool limited to a kind that is rare next to another kind's backlog gets
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
-- round trip rather than four (BEGIN / SET LOCAL / claim / COMMIT). Losing a claim
-- in a server crash is harmless: the job is pending again with its attempt not
-- even counted, and a worker that had started it is fenced out when it reports,
-- since the next claim draws a token past the lost one (nextval is not rolled
-- back, and the sequence is WAL-logged ahead of the values it hands out).
-- Concurrency keys: a job with a concurrency_key is not in jobs_claim_idx; it
-- is claimed through its key's row in job_concurrency_keys (`ready`), which
-- the claim locks FOR NO KEY UPDATE SKIP LOCKED: while one claim holds a key,
-- no other claim takes that key's jobs, and a key another claim holds is
-- skipped, never waited for. Under that lock the row's in_flight and token
-- bucket are current (the locking read returns the newest version and
-- rechecks the WHERE on it), so `room` (what the key may start now: below
-- max_in_flight, within its tokens, zero while paused) cannot be spent twice
-- by two worker pools; `counted` adds what was taken, in this same statement.
-- Finishing, releasing and reaping give slots back (finish_jobs.sql,
-- hand_back_jobs.sql, update_reaped_jobs.sql), only ever lowering in_flight,
-- and a relative update (in_flight + n) keeps each of them. A key without
-- room is filtered out on its row: its pending jobs are never read, so a
-- saturated or paused key's backlog costs the claim one key row, and those
-- jobs stay pending for whichever claim finds the key with room.
--
-- Index: keys are walked least recently served first
-- (job_concurrency_keys_served_idx), each key's jobs through
-- jobs_concurrency_claim_idx (concurrency_key, run_after, id), at most `room`
-- of them (LIMIT inside the lateral), and the walk stops once $1 keyed jobs
-- are found. Keyless jobs fill the rest of the batch, through the ordered
-- scan of jobs_claim_idx as before (its LIMIT, $1 less the keyed jobs, is
-- computed once). Keyed jobs come first: a key's limits bound what it can
-- take, and a keyless backlog must not hold every key's jobs back; keys
-- without limits compete with keyless jobs on equal terms only if they are
-- given limits. A key whose row says it has room but which
-- has no due job costs one probe of that index (the walk's cost grows with
-- such idle keys, never with the jobs of saturated ones).
--
WITH async_commit AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true)
),
-- The keys that may start a job now, and how many.
ready AS (
    SELECT k.key,
           least($1,
                 coalesce(k.max_in_flight - k.in_flight, $1),
                 CASE WHEN k.per_second IS NULL THEN $1
                      ELSE floor(least(greatest(1.0, k.per_second / 10),
                                       coalesce(k.tokens + k.per_second
                                                    * extract(epoch FROM now() - k.tokens_at),
                                                'Infinity'))) END)::bigint AS room
    FROM job_concurrency_keys AS k
    WHERE (k.paused_until IS NULL OR k.paused_until <= now())
      AND (k.max_in_flight IS NULL OR k.in_flight < k.max_in_flight)
      AND (k.per_second IS NULL
           OR k.tokens IS NULL
           OR k.tokens + k.per_second * extract(epoch FROM now() - k.tokens_at) >= 1)
    ORDER BY k.served_at, k.key
    FOR NO KEY UPDATE OF k SKIP LOCKED
),
keyed AS (
    SELECT m.id
    FROM ready AS r
    CROSS JOIN LATERAL (
        SELECT j.id
        FROM jobs AS j
        WHERE j.concurrency_key = r.key
          AND j.finished_at IS NULL
          AND NOT j.blocked
          AND j.waiting_on = '{}'
          AND j.run_after <= now()
          AND j.status = 'pending'
          AND j.kind = ANY($2)
        ORDER BY j.run_after, j.id
        LIMIT r.room
        FOR UPDATE OF j SKIP LOCKED
    ) AS m
    LIMIT $1
),
keyless AS (
    SELECT id
    FROM jobs
    WHERE finished_at IS NULL
      AND NOT blocked
      AND concurrency_key IS NULL
      AND waiting_on = '{}'
      AND run_after <= now()
      AND (run_after, id) > (coalesce($5::timestamptz, '-infinity'), $6::bigint)
      AND status = 'pending'
      AND kind = ANY($2)
    ORDER BY run_after, id
    LIMIT $1 - (SELECT count(*) FROM keyed)
    FOR UPDATE SKIP LOCKED
),
picked AS (
    SELECT id FROM keyed
    UNION ALL
    SELECT id FROM keyless
),
claimed AS (
UPDATE jobs AS j
SET status = 'processing',
    locked_by = $3,
    locked_at = now(),
    lease_expires_at = now() + $4 * interval '1 millisecond',
    attempts = j.attempts + 1,
    lease_token = nextval('jobs_lease_token_seq')
FROM async_commit
-- An array of ids, not a join: the keyless LIMIT above is an expression the
-- planner cannot estimate, and a join sized by its guess (a tenth of the
-- table) would be a hash join over a scan of the whole table; = ANY is
-- always a probe of the primary key per id.
WHERE j.id = ANY (ARRAY(SELECT id FROM picked))
RETURNING j.id, j.kind, j.payload, j.attempts, j.max_attempts, j.lease_token,
          j.created_at, j.trace_context, j.run_after, j.concurrency_key,
          j.unfinished_parents,
          -- Whether its end touches no other row (finish_standalone_jobs.sql).
          (j.ordering_key IS NULL AND j.concurrency_key IS NULL
           AND j.has_dependents IS FALSE) AS standalone
),
taken AS (
    SELECT concurrency_key AS key, count(*) AS n
    FROM claimed
    WHERE concurrency_key IS NOT NULL
    GROUP BY concurrency_key
),
-- Rows `ready` locked: no other statement changed them since.
counted AS (
    UPDATE job_concurrency_keys AS k
    SET in_flight = k.in_flight + t.n,
        tokens = CASE WHEN k.per_second IS NULL THEN NULL
                      ELSE least(greatest(1.0, k.per_second / 10),
                                 coalesce(k.tokens + k.per_second
                                              * extract(epoch FROM now() - k.tokens_at),
                                          'Infinity')) - t.n END,
        tokens_at = now(),
        served_at = now()
    FROM taken AS t
    WHERE k.key = t.key
),
-- The claim's row in job_claims (the core's migration): where the reaper
-- finds these leases should they expire, without reading the backlog.
-- Written by this statement, so no claim commits without it, or it without
-- the claim; none when nothing was claimed. Its expires_at is the leases'
-- own expression, so the two are equal.
recorded AS (
    INSERT INTO job_claims (locked_by, expires_at, job_ids, lease_tokens)
    SELECT $3, now() + $4 * interval '1 millisecond', array_agg(id), array_agg(lease_token)
    FROM claimed
    HAVING count(*) > 0
)
SELECT id, kind, payload, attempts, max_attempts, lease_token, created_at, trace_context,
       run_after, concurrency_key, unfinished_parents, standalone
FROM claimed
