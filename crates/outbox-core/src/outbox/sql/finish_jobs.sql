-- Records the outcomes of many claims at once. $1 ids, $2 lease tokens (the
-- fencing tokens of the claims), $3 new statuses ('done', 'pending' for a
-- retry, 'failed'), $4 retry delays in ms (used for 'pending'), $5 errors
-- (NULL keeps last_error as it was), $6 the channel to NOTIFY when a
-- dependent becomes claimable (NULL: none; the caller wakes the kinds the
-- rows name). Returns one row per claim still held
-- (status 'processing' with the same token), with that token, so two claims
-- of one job in one call are told apart: `applied` says whether its
-- outcome was written; false means the row was locked by another transaction
-- at that moment, and the caller writes it again shortly. A claim with no row
-- is lost: reaped and re-claimed, cancelled, or finished by someone else.
--
-- Index: the primary key (j.id = ANY($1)): one probe per outcome, in
-- `locked`; the write (`written`, `moved`) then goes straight to the row
-- version that probe locked, by its ctid, without a second probe. Every join below is on a key or hashed, never CTE
-- scan to CTE scan in a nested loop, which would make a batch cost the square
-- of its outcomes and cap the worker pool's throughput. Done jobs are deleted from `jobs` and
-- inserted into jobs_done, whose only indexes are BRIN (no entry per row);
-- retries and failures are updates of the row in place.
--
-- Fencing: a row changes only while it is 'processing' under the token this
-- claim got. A zombie's late batch matches nothing and changes nothing.
-- SKIP LOCKED: the completer never waits on a row lock, so one row held by an
-- operator's open transaction cannot stall the outcomes of every other job;
-- the locking read re-checks the newest row version, so a claim that changed
-- hands meanwhile is never written.
--
-- Ordering keys: a job that ends `done` (leaves `jobs`) releases the next job of its key (the
-- oldest blocked one), in this same statement, so the key's next job becomes
-- claimable exactly when its predecessor's completion commits. A concurrent
-- enqueue behind the same key holds the head row FOR SHARE until it commits
-- (lock_ordering_heads.sql); SKIP LOCKED then reports the head busy, and the
-- retry, with a newer snapshot, sees and releases the new job.
--
-- Dependencies: the parents this statement ends `done` (moved) leave the
-- `waiting_on` of their dependents, and those it ends `failed` leave it for
-- dependents of policy 'run' (which note them in `unfinished_parents`); a
-- dependent whose `waiting_on` becomes empty is claimable once this commits,
-- and a NOTIFY (delivered at the commit) wakes the worker pools of its kind, as an
-- enqueue does. Parents known to have none (`has_dependents` false, set by
-- their writer; a dependent enqueued later sets it true) are not looked up
-- in jobs_waiting_on_idx: a batch of jobs without dependents does not probe
-- it at all (a GIN probe costs the square of its ids). Fencing holds: only
-- parents this statement moved or wrote (under their claim's token) release
-- anything, so a zombie's late outcome releases nothing.
-- Two parents of one dependent finishing in concurrent transactions: each
-- removes its own id from the dependent's `waiting_on` under the row lock,
-- and the second, waiting on the first's lock, recomputes the array from the
-- row the first committed (READ COMMITTED's recheck of an updated row), so
-- neither leaves the other's id behind and the last one empties it. The rows
-- are locked in id order first (`targets`), so two completers releasing the
-- same dependents cannot deadlock. A dependent enqueued while its parent
-- finishes holds the parent's row, which it marks (lock_dependency_parents.sql):
-- SKIP LOCKED reports the parent busy, and the retry sees the dependent; and
-- once that enqueue has committed, a snapshot that cannot see the dependent
-- cannot see the marked version either, so the parent is answered busy then
-- too (`locked`, below). The
-- next job of an ordering key and the dependents are updated by one UPDATE
-- (`released`): two CTEs updating one row would keep only one change.
--
-- Concurrency keys: every claim this statement ends (`written` and `moved`
-- return only rows that were 'processing' under the claim's token) gives
-- its slot back to its key (`freed`, through jobs_free_concurrency_slots,
-- which says why that is once and cannot deadlock). `freed` runs through
-- `released_after_freeing`, which every row of the answer reads; when no
-- row is answered, no claim ended and there is nothing to free.
WITH outcome AS MATERIALIZED (
    SELECT *
    FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::bigint[], $5::text[])
         AS o(id, lease_token, status, delay_ms, error)
),
-- Locks by id alone (a primary-key probe per id), then keeps the rows whose
-- token matches: a row of a lost claim is locked only for this statement.
-- The ctid is the version locked: the newest, which the locking read
-- rechecked. Should a transaction have changed the row and committed after
-- this statement's snapshot (a heartbeat's lease extension), that version
-- is invisible to the snapshot, so `written` and `moved`, which read by
-- ctid under it, find nothing: the claim is answered not applied (busy)
-- and written again by a later statement, whose snapshot sees it.
locked AS (
    SELECT j.ctid, j.id, j.lease_token
    FROM jobs AS j
    WHERE j.id = ANY($1)
      AND j.status = 'processing'
    -- FOR UPDATE, not NO KEY UPDATE: a done job's row is deleted, which
    -- needs the strongest row lock; taking it here, with SKIP LOCKED, means
    -- the DELETE below never waits.
    FOR UPDATE OF j SKIP LOCKED
),
lockable AS (
    SELECT k.ctid, o.id, o.lease_token, o.status, o.delay_ms, o.error
    FROM locked AS k
    JOIN outcome AS o ON o.id = k.id AND o.lease_token = k.lease_token
),
written AS (
    UPDATE jobs AS j
    SET status = l.status,
        run_after = jobs_run_again_at(l.status, l.delay_ms, j.run_after),
        finished_at = CASE WHEN l.status = 'pending' THEN NULL ELSE now() END,
        last_error = COALESCE(l.error, j.last_error),
        locked_by = CASE WHEN l.status = 'pending' THEN NULL ELSE j.locked_by END,
        locked_at = CASE WHEN l.status = 'pending' THEN NULL ELSE j.locked_at END,
        lease_expires_at = NULL
    FROM lockable AS l
    WHERE j.ctid = l.ctid
      AND l.status <> 'done'
      AND j.status = 'processing'
      AND j.lease_token = l.lease_token
    RETURNING j.id, j.status, j.ordering_key, j.concurrency_key, j.has_dependents
),
-- A done job leaves `jobs` (no dead index entries or tuples for a later
-- DELETE to clean up) and is appended to the day partition of jobs_done.
moved AS (
    DELETE FROM jobs AS j
    USING lockable AS l
    WHERE j.ctid = l.ctid
      AND l.status = 'done'
      AND j.status = 'processing'
      AND j.lease_token = l.lease_token
    RETURNING j.id, j.kind, j.payload, j.run_after, j.attempts, j.max_attempts,
              j.locked_by, j.locked_at, j.created_at, j.last_error, j.lease_token,
              j.trace_context, j.ordering_key, j.concurrency_key, j.depends_on,
              j.dependency_policy, j.unfinished_parents, j.has_dependents
),
archived AS (
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
    RETURNING id
),
-- The next job of each ordering key a done job held.
key_next AS (
    SELECT (SELECT m.id
            FROM jobs AS m
            WHERE m.ordering_key = w.ordering_key
              AND m.status = 'pending'
              AND m.blocked
            ORDER BY m.id
            LIMIT 1) AS id
    FROM moved AS w
    WHERE w.ordering_key IS NOT NULL
),
-- The parents ended here that may have dependents: done, and failed.
ended_parents AS MATERIALIZED (
    SELECT ARRAY(SELECT id FROM moved WHERE has_dependents IS NOT FALSE) AS done,
           ARRAY(SELECT id FROM written
                 WHERE status = 'failed' AND has_dependents IS NOT FALSE) AS failed
),
children AS (
    SELECT c.id
    FROM jobs AS c, ended_parents AS e
    WHERE cardinality(e.done) + cardinality(e.failed) > 0
      AND c.waiting_on <> '{}'
      AND c.waiting_on && (e.done || e.failed)
      AND (c.waiting_on && e.done
           OR (c.dependency_policy = 'run' AND c.waiting_on && e.failed))
),
targets AS (
    SELECT t.id
    FROM jobs AS t
    WHERE t.id = ANY (ARRAY(SELECT id FROM key_next WHERE id IS NOT NULL
                            UNION
                            SELECT id FROM children))
      AND t.status = 'pending'
    ORDER BY t.id
    FOR NO KEY UPDATE OF t
),
released AS (
    UPDATE jobs AS n
    SET blocked = n.blocked AND n.id <> ALL (ARRAY(SELECT id FROM key_next WHERE id IS NOT NULL)),
        waiting_on = ARRAY(SELECT p
                           FROM unnest(n.waiting_on) AS p
                           WHERE p <> ALL (e.done)
                             AND (n.dependency_policy = 'hold' OR p <> ALL (e.failed))),
        unfinished_parents = CASE
            WHEN n.dependency_policy = 'run' AND n.waiting_on && e.failed
            THEN coalesce(n.unfinished_parents, '{}')
                 || ARRAY(SELECT p FROM unnest(n.waiting_on) AS p WHERE p = ANY (e.failed))
            ELSE n.unfinished_parents END
    FROM ended_parents AS e
    WHERE n.id = ANY (ARRAY(SELECT id FROM targets))
      AND n.status = 'pending'
    RETURNING n.id, n.kind, n.blocked, n.waiting_on,
              -- A hashed subplan, built once: `= ANY (ARRAY(...))` would
              -- test each row against every child, quadratic in the
              -- dependents one finish releases.
              n.id IN (SELECT id FROM children) AS dependent
),
-- The kinds whose dependents became claimable (a key's next job stays as
-- before: the worker pool that finished its predecessor claims it).
woken_kinds AS MATERIALIZED (
    SELECT DISTINCT r.kind
    FROM released AS r
    WHERE r.dependent AND r.waiting_on = '{}' AND NOT r.blocked
),
-- Wakes their worker pools at commit, unless $6 is NULL: the worker pool's
-- own finish passes NULL and wakes them itself after commit (a NOTIFY here
-- would hold PostgreSQL's notify lock through this commit's WAL flush, and
-- every other notifying commit would queue behind it).
woken AS (
    SELECT pg_notify($6, k.kind)
    FROM woken_kinds AS k
    WHERE $6::text IS NOT NULL
),
-- The slots of the claims ended here (jobs_free_concurrency_slots, a core
-- migration); no call when none had a key.
freed AS (
    SELECT jobs_free_concurrency_slots(e.keys)
    FROM (SELECT ARRAY(SELECT concurrency_key FROM written WHERE concurrency_key IS NOT NULL
                          UNION ALL
                          SELECT concurrency_key FROM moved WHERE concurrency_key IS NOT NULL) AS keys) AS e
    WHERE e.keys <> '{}'
),
-- Claims this statement could not lock: still held (busy: locked by another
-- transaction at this moment) or lost. Usually none, so the probe is skipped.
busy AS (
    SELECT j.id, j.lease_token
    FROM outcome AS o
    JOIN jobs AS j ON j.id = o.id AND j.lease_token = o.lease_token
    WHERE o.id NOT IN (SELECT id FROM lockable)
      AND j.status = 'processing'
),
-- `released` counts the jobs made claimable; `woken` runs only through it.
released_count AS (
    SELECT count(*) AS n
    FROM released AS r
    WHERE r.waiting_on = '{}' AND NOT r.blocked
      AND (SELECT count(*) FROM woken) >= 0
),
-- The one row of `released_count`, read only once `freed` has run: every
-- row of the answer reads it, so the slots are given back whenever a claim
-- ended here, whether or not anything was released.
released_after_freeing AS (
    SELECT c.n
    FROM released_count AS c
    WHERE (SELECT count(*) FROM freed) >= 0
)
SELECT l.id,
       l.lease_token,
       (l.id IN (SELECT id FROM written) OR l.id IN (SELECT id FROM archived)) AS applied,
       (SELECT n FROM released_after_freeing) AS released,
       ARRAY(SELECT kind FROM woken_kinds ORDER BY kind) AS woken_kinds
FROM lockable AS l
UNION ALL
SELECT b.id, b.lease_token, false, (SELECT n FROM released_after_freeing),
       ARRAY(SELECT kind FROM woken_kinds ORDER BY kind)
FROM busy AS b
