-- Ends `done` the claims of standalone jobs: jobs whose end changes no other
-- row, having no ordering key (no next job to release), no concurrency key
-- (no slot to give back) and no dependent (`has_dependents` false: nothing
-- waits for them). $1 ids, $2 the claims' lease tokens. Returns `(id,
-- lease_token)` of each claim it ended; the caller sends every other one,
-- whatever the reason, to finish_jobs.sql, which answers it applied, busy or
-- lost as always.
--
-- Why a second statement: finish_jobs.sql pays for everything an outcome may
-- touch (keys, dependents, slots, retries, its busy report) even when a
-- batch touches none of it, and takes each row's lock in a locking read of
-- its own (a WAL record a row) before it writes it: over batches of 256,
-- 6.7 µs a job against this one's 4.0 (docs/performance.md, "The
-- standalone finish"). The claim says which jobs were standalone when claimed
-- (`ClaimedJob::standalone`); this statement checks all three again on the
-- row it deletes, so a job that has gained a dependent since
-- (lock_dependency_parents.sql marks it) is left to finish_jobs.sql, which
-- releases that dependent.
--
-- Index: the primary key (j.id = ANY($1)), one probe per claim, whatever the
-- statistics say: a join of the ids to `jobs` would be planned from them, and
-- statistics taken while no job was processing made it a sequential scan of
-- `jobs` for every id (400 ms a batch in a drain). jobs_done has only BRIN
-- indexes: the archive costs no index entry per row.
--
-- Fencing: a row moves only while it is 'processing' under one of the tokens
-- given. A token is drawn for one claim of one job and never again
-- (claim_jobs.sql), so a row whose token is among them is the row of the
-- claim that token names: the pair needs no join. A zombie's token is no
-- row's any more, and its claim is left to finish_jobs.sql, which answers it
-- lost.
--
-- Locks: unlike finish_jobs.sql, the DELETE takes each row's lock itself, and
-- may wait for it, `bounded`: for at most lock_timeout, set for this
-- statement's own transaction only (set_config's third argument), read when
-- a wait begins; on the timeout the statement fails whole, nothing written,
-- and the caller sends every claim to finish_jobs.sql, which never waits.
-- Who holds a processing job's row: a heartbeat, a reaper or an operator's
-- statement for a moment, or a transaction that enqueues a dependent of it
-- (lock_dependency_parents.sql) until it commits. Rows are deleted in id
-- order (the index scan's), as the heartbeat and finish_jobs.sql lock them, so no
-- deadlock. A row another transaction changed and committed after this
-- statement's snapshot is rechecked against the WHERE in its newest version
-- (READ COMMITTED): a heartbeat's passes, a new claim's token or a
-- dependent's mark does not, and that claim is left to finish_jobs.sql.
WITH bounded AS MATERIALIZED (
    SELECT set_config('lock_timeout', '50ms', true)
),
moved AS (
    DELETE FROM jobs AS j
    USING bounded
    WHERE j.id = ANY ($1)
      AND j.lease_token = ANY ($2)
      AND j.status = 'processing'
      AND j.ordering_key IS NULL
      AND j.concurrency_key IS NULL
      AND j.has_dependents = false
    RETURNING j.id, j.kind, j.payload, j.run_after, j.attempts, j.max_attempts,
              j.locked_by, j.locked_at, j.created_at, j.last_error, j.lease_token,
              j.trace_context, j.ordering_key, j.concurrency_key, j.depends_on,
              j.dependency_policy, j.unfinished_parents, j.has_dependents
)
INSERT INTO jobs_done (id, kind, payload, status, run_after, attempts,
                       max_attempts, locked_by, locked_at, lease_expires_at, created_at,
                       finished_at, last_error, lease_token, trace_context, ordering_key,
                       blocked, concurrency_key, depends_on, dependency_policy,
                       unfinished_parents, has_dependents)
SELECT id, kind, payload, 'done', run_after, attempts, max_attempts, locked_by,
       locked_at, NULL, created_at, now(), last_error, lease_token, trace_context,
       ordering_key, false, concurrency_key, depends_on, dependency_policy,
       unfinished_parents, has_dependents
FROM moved
RETURNING id, lease_token
