-- The queue's schema, whole: the jobs table, the archive of done jobs and
-- its retention functions, the jobs_all view, the live claims, concurrency
-- keys, job dependencies, the inbox and periodic jobs. ARCHITECTURE.md ("Job state")
-- says what each statement that moves a job relies on.
--
-- An application may add columns of its own to `jobs` and `jobs_done` (with
-- the same name in both, and in the view); the queue names only these.

-- The outbox. Every row is one job to perform; the relay moves it through
-- pending -> processing -> done | failed, and an operator may cancel it.
CREATE TABLE jobs (
    id               bigserial   PRIMARY KEY,
    kind             text        NOT NULL,
    payload          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    status           text        NOT NULL DEFAULT 'pending',
    -- A job is due once run_after <= now(); retries push it into the future.
    run_after        timestamptz NOT NULL DEFAULT now(),
    -- Incremented by every claim.
    attempts         int         NOT NULL DEFAULT 0,
    max_attempts     int         NOT NULL DEFAULT 8,
    locked_by        text        NULL,
    locked_at        timestamptz NULL,
    lease_expires_at timestamptz NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz NULL,
    last_error       text        NULL,
    -- The fencing token of the newest claim, from jobs_lease_token_seq; kept
    -- after the job leaves 'processing'; NULL only for jobs never claimed.
    lease_token      bigint      NULL,
    -- The W3C trace context of whoever enqueued the job: {"traceparent": ...,
    -- "tracestate": ...}; the relay's span for the job becomes its child.
    trace_context    jsonb       NULL,
    -- Jobs that share an ordering_key run one at a time, in id (enqueue)
    -- order. `blocked` marks a job that has an earlier unfinished job (pending,
    -- processing or failed) with its key: set at enqueue, cleared for the next
    -- job when its predecessor ends done or cancelled. Blocked jobs are out of
    -- the claim's indexes, so a key held up by a failed head costs the claim
    -- nothing however many jobs wait behind it.
    ordering_key     text        NULL,
    blocked          boolean     NOT NULL DEFAULT false,
    -- The key whose limits the job counts against (job_concurrency_keys,
    -- below); NULL: none.
    concurrency_key  text        NULL,
    -- Dependencies: the ids of the parents this job still waits for (not
    -- done yet, or, policy `hold`, failed); empty when it waits for none.
    -- The finish that marks a parent done takes it out of each dependent's
    -- `waiting_on` in the same statement (finish_jobs.sql); a dependent
    -- whose `waiting_on` is empty is an ordinary pending job.
    waiting_on       bigint[]    NOT NULL DEFAULT '{}',
    -- Every parent the job was enqueued with, for display (NULL: none).
    depends_on       bigint[]    NULL,
    -- What a parent that does not end done does to this job: 'hold' (a failed
    -- parent holds it until retried; a cancelled one cancels it) or 'run' (it
    -- runs anyway). NULL for a job without parents.
    dependency_policy text       NULL,
    -- Policy 'run': the parents that ended failed or cancelled, which the
    -- worker is told about (JobContext::unfinished_parents).
    unfinished_parents bigint[]  NULL,
    CONSTRAINT jobs_status_valid
        CHECK (status IN ('pending', 'processing', 'done', 'failed', 'cancelled')),
    CONSTRAINT jobs_attempts_not_negative CHECK (attempts >= 0),
    CONSTRAINT jobs_max_attempts_positive CHECK (max_attempts > 0),
    CONSTRAINT jobs_kind_not_empty CHECK (kind <> ''),
    -- A processing job always has an owner, a lease and the token of the
    -- claim that holds it: the reaper and every fenced statement rely on it.
    CONSTRAINT jobs_processing_has_lease CHECK (
        status <> 'processing'
        OR (locked_by IS NOT NULL AND lease_expires_at IS NOT NULL AND lease_token IS NOT NULL)
    ),
    CONSTRAINT jobs_blocked_is_a_waiting_keyed_job
        CHECK (NOT blocked OR (status = 'pending' AND ordering_key IS NOT NULL)),
    CONSTRAINT jobs_dependency_policy_valid
        CHECK (dependency_policy IS NULL OR dependency_policy IN ('hold', 'run')),
    CONSTRAINT jobs_waiting_has_parents
        CHECK (waiting_on = '{}' OR (depends_on IS NOT NULL AND dependency_policy IS NOT NULL))
);

-- A fencing token per claim. A sequence never hands out a value twice,
-- across crashes included (nextval is not transactional and the sequence's
-- WAL is flushed ahead of any commit that used it), so every claim gets a
-- token no earlier or later claim ever had; (locked_by, attempts) could repeat.
CREATE SEQUENCE jobs_lease_token_seq AS bigint;

-- No index on `jobs` mentions a column the claim or the heartbeat changes
-- (status, locked_by, locked_at, lease_expires_at, attempts, lease_token), so
-- both are HOT updates: a heap version and no index entry.
--
-- The claim's indexes: pending and processing jobs (not finished), not
-- waiting behind their ordering key or for parents, without a concurrency
-- key; their key is the claim's ORDER BY, so the claim is an ordered index
-- scan that stops after its batch. Keyed jobs are claimed through their key
-- (claim_jobs.sql): the claim walks the keys that may start a job now, then
-- each key's own index, so a saturated or paused key's jobs stay `pending`
-- and cost the claim nothing. Jobs without parents pay nothing for
-- dependencies beyond an empty array: the predicate `waiting_on = '{}'`,
-- which the claim repeats.
CREATE INDEX jobs_claim_idx ON jobs (run_after, id)
    WHERE finished_at IS NULL AND NOT blocked AND concurrency_key IS NULL AND waiting_on = '{}';
CREATE INDEX jobs_kind_claim_idx ON jobs (kind, run_after, id)
    WHERE finished_at IS NULL AND NOT blocked AND concurrency_key IS NULL AND waiting_on = '{}';
-- A key's claimable jobs in claim order.
CREATE INDEX jobs_concurrency_claim_idx ON jobs (concurrency_key, run_after, id)
    WHERE finished_at IS NULL AND NOT blocked AND concurrency_key IS NOT NULL AND waiting_on = '{}';
-- Failed and cancelled jobs by the time they ended (retry, gauges).
CREATE INDEX jobs_finished_idx ON jobs (finished_at) WHERE finished_at IS NOT NULL;
-- An ordering key's jobs still in `jobs`, in order (done jobs have left).
CREATE INDEX jobs_ordering_key_idx ON jobs (ordering_key, id) WHERE ordering_key IS NOT NULL;
-- The dependents a finishing parent releases: only waiting rows are in it,
-- so a finish whose jobs have no dependents probes an index without entries
-- for them, and an enqueue without parents adds no entry.
CREATE INDEX jobs_waiting_on_idx ON jobs USING gin (waiting_on) WHERE waiting_on <> '{}';
-- A job's children, wherever they are (the dashboard's job page).
CREATE INDEX jobs_depends_on_idx ON jobs USING gin (depends_on) WHERE depends_on IS NOT NULL;

-- A queue table churns: vacuum and analyze after 2% of the rows changed, not
-- the default 20%, so dead entries do not pile up in the claim's index.
-- Fillfactor 40 leaves room on each page for every row's claimed version,
-- which a HOT update must place on the page of the version it replaces.
ALTER TABLE jobs SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    fillfactor = 40
);

-- Live claims: one row per claim statement that took jobs, inserted by it
-- (claim_jobs.sql), so that the reaper finds expired leases through
-- job_claims_expires_idx instead of reading the backlog (`jobs` may have no
-- index on the lease, above). expires_at is never later than the lease of a
-- job the row still holds (processing under the row's token): the claim
-- writes both alike, the heartbeat renews a row only with all such jobs
-- (extend_leases.sql), and the trigger below carries a lease moved earlier.
-- A row that holds no job any more never will (tokens are never reused): a
-- heartbeat or a reaper deletes it. Logged, as the leases it points at are.
CREATE TABLE job_claims (
    id           bigserial   PRIMARY KEY,
    locked_by    text        NOT NULL,
    expires_at   timestamptz NOT NULL,
    job_ids      bigint[]    NOT NULL,
    lease_tokens bigint[]    NOT NULL,
    CONSTRAINT job_claims_a_token_a_job CHECK (cardinality(job_ids) = cardinality(lease_tokens))
-- A claim of up to ~500 jobs stays one plain row: no compression, no TOAST.
) WITH (toast_tuple_target = 8160);
CREATE INDEX job_claims_expires_idx ON job_claims (expires_at);
CREATE INDEX job_claims_locked_by_idx ON job_claims (locked_by);

-- A lease moved earlier by someone else's statement (an operator expiring a
-- stuck claim, a test moving the clock) moves its claim row's expiry too,
-- or the reaper would not look before the row expired. The queue's own
-- statements move a lease only later or out of 'processing', so the WHEN is
-- false for the rows they write and the function never runs for them.
CREATE FUNCTION job_claims_follow_lease() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE job_claims SET expires_at = NEW.lease_expires_at
    WHERE locked_by = OLD.locked_by AND OLD.lease_token = ANY (lease_tokens)
      AND expires_at > NEW.lease_expires_at;
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_claim_follows_lease AFTER UPDATE OF lease_expires_at ON jobs FOR EACH ROW
    WHEN (OLD.status = 'processing' AND NEW.status = 'processing'
          AND NEW.lease_token = OLD.lease_token AND NEW.lease_expires_at < OLD.lease_expires_at)
    EXECUTE FUNCTION job_claims_follow_lease();

-- The archive: a job that ends `done` leaves `jobs` in the statement that
-- finishes it and is appended here, partitioned by day of finished_at.
-- Retention drops whole partitions, so nothing is left for a DELETE to kill
-- and for vacuum to clean under a pinned MVCC horizon.
CREATE TABLE jobs_done (
    id               bigint      NOT NULL,
    kind             text        NOT NULL,
    payload          jsonb       NOT NULL,
    status           text        NOT NULL,
    run_after        timestamptz NOT NULL,
    attempts         int         NOT NULL,
    max_attempts     int         NOT NULL,
    locked_by        text        NULL,
    locked_at        timestamptz NULL,
    lease_expires_at timestamptz NULL,
    created_at       timestamptz NOT NULL,
    finished_at      timestamptz NOT NULL,
    last_error       text        NULL,
    lease_token      bigint      NULL,
    trace_context    jsonb       NULL,
    ordering_key     text        NULL,
    blocked          boolean     NOT NULL DEFAULT false,
    concurrency_key  text        NULL,
    waiting_on       bigint[]    NOT NULL DEFAULT '{}',
    depends_on       bigint[]    NULL,
    dependency_policy text       NULL,
    unfinished_parents bigint[]  NULL,
    -- Only `done` jobs move here today; failed and cancelled are allowed so that
    -- an archive of every finished job stays possible without a migration.
    CONSTRAINT jobs_done_status_finished CHECK (status IN ('done', 'failed', 'cancelled'))
) PARTITION BY RANGE (finished_at);

-- No btree: each would cost an entry per finished job. Rows are appended in
-- finished_at order, so ids rise with the heap: a BRIN summary per 16 pages
-- finds a job by reading a few ranges, and costs nothing per row.
CREATE INDEX jobs_done_id_brin ON jobs_done USING brin (id) WITH (pages_per_range = 16, autosummarize = on);
CREATE INDEX jobs_done_finished_at_brin ON jobs_done USING brin (finished_at) WITH (pages_per_range = 16, autosummarize = on);
-- A job's children among the done ones (few jobs have parents).
CREATE INDEX jobs_done_depends_on_idx ON jobs_done USING gin (depends_on)
    WHERE depends_on IS NOT NULL;

-- Catches rows for a day nobody made a partition for (a relay down for days,
-- a clock far off). jobs_done_ensure_partitions moves them out when it makes
-- their day's partition.
CREATE TABLE jobs_done_default PARTITION OF jobs_done DEFAULT;

-- Makes the daily partitions from the day of `since` through `days_ahead` days
-- after today (UTC), moving any of their rows out of the default partition
-- first (a partition cannot be attached over rows the default holds). The relay
-- calls it at start and hourly, `jobs prune` on every run; it is idempotent and
-- safe to run from many processes at once (an advisory lock serialises them).
CREATE FUNCTION jobs_done_ensure_partitions(since timestamptz, days_ahead int)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    day date := (since AT TIME ZONE 'UTC')::date;
    last date := (now() AT TIME ZONE 'UTC')::date + days_ahead;
    name text;
    made int := 0;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('jobs_done_ensure_partitions'));
    WHILE day <= last LOOP
        name := 'jobs_done_' || to_char(day, 'YYYYMMDD');
        IF to_regclass(name) IS NULL THEN
            EXECUTE format(
                'CREATE TABLE %I (LIKE jobs_done INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', name);
            EXECUTE format(
                'WITH moved AS (DELETE FROM jobs_done_default
                                WHERE finished_at >= %L AND finished_at < %L RETURNING *)
                 INSERT INTO %I SELECT * FROM moved',
                (day::timestamp AT TIME ZONE 'UTC'), ((day + 1)::timestamp AT TIME ZONE 'UTC'), name);
            EXECUTE format(
                'ALTER TABLE jobs_done ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                name, (day::timestamp AT TIME ZONE 'UTC'), ((day + 1)::timestamp AT TIME ZONE 'UTC'));
            made := made + 1;
        END IF;
        day := day + 1;
    END LOOP;
    RETURN made;
END $$;

-- Today's and the next two days' partitions, now: the relay keeps them made
-- (at start, then hourly), but its first finishes must not race it for
-- today's (a row routed to the default partition while today's is attached
-- is refused, and a reader can miss a row that moves meanwhile).
SELECT jobs_done_ensure_partitions(now(), 2);

-- Every job wherever it lives, with the columns of `jobs`. A job is in exactly
-- one of the two: the move is one statement in one transaction.
--
-- `jobs` and `jobs_done` have the same columns in the same order, so the
-- view is each table's every column. An application that adds columns of its
-- own to both (in the same order) replaces the view with the same statement
-- (CREATE OR REPLACE VIEW), which keeps these columns first and adds its own.
CREATE VIEW jobs_all AS
SELECT * FROM jobs
UNION ALL
SELECT * FROM jobs_done;

-- Retention of the done-job archive (`jobs prune`): which daily partitions of
-- jobs_done lie wholly before a cutoff, and dropping one of them without ever
-- queueing the relay's inserts behind a long lock wait. Partition names reach
-- DDL only as regclass values read from the catalog, never as text a caller
-- typed.

-- The exclusive upper bound of a range partition of jobs_done, from its bound
-- as the catalog prints it (`FOR VALUES FROM ('...') TO ('...')`); NULL for the
-- default partition or an unbounded one, which retention never drops. The
-- printed timestamp uses the session's TimeZone and is read back under it.
CREATE FUNCTION jobs_done_partition_upper_bound(part regclass)
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz
    FROM pg_class AS c
    WHERE c.oid = part
$$;

-- The partitions of jobs_done whose upper bound is at or before `cutoff` (so
-- every row in them finished before it), oldest first, with how many rows each
-- holds. The count reads each such partition once; nothing else is read, and
-- no lock is taken on jobs_done itself.
CREATE FUNCTION jobs_done_partitions_before(cutoff timestamptz)
RETURNS TABLE (partition_name text, upper_bound timestamptz, job_count bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    p record;
BEGIN
    FOR p IN
        SELECT i.inhrelid::regclass AS part, jobs_done_partition_upper_bound(i.inhrelid) AS bound
        FROM pg_inherits AS i
        WHERE i.inhparent = 'jobs_done'::regclass
        ORDER BY bound
    LOOP
        CONTINUE WHEN p.bound IS NULL OR p.bound > cutoff;
        partition_name := p.part::text;
        upper_bound := p.bound;
        EXECUTE format('SELECT count(*) FROM %s', p.part) INTO job_count;
        RETURN NEXT;
    END LOOP;
END $$;

-- Drops one partition of jobs_done if it is still one whose upper bound is at
-- or before `cutoff`. Returns 'dropped'; 'gone' when it no longer exists (a
-- concurrent prune dropped it) or is not a partition of jobs_done; 'young'
-- when its bound is after the cutoff; 'busy' when its lock did not come within
-- `lock_timeout_ms`.
--
-- Why the timeout: DROP TABLE of a partition takes an ACCESS EXCLUSIVE lock on
-- jobs_done, and a lock request waiting in the queue blocks every later one,
-- so a drop stuck behind a long reader of jobs_all would hold up every
-- relay's insert of a finished job for as long as it waits. With the timeout
-- the wait is bounded; the caller calls again, each time in a new short
-- transaction (a statement of its own), and the drop itself is a catalog
-- change that takes milliseconds.
--
-- Concurrent prunes are serialised by an advisory lock (held only to the end
-- of this short transaction), so exactly one reports a partition dropped.
CREATE FUNCTION jobs_done_drop_partition(partition_name text, cutoff timestamptz, lock_timeout_ms int)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    part regclass;
    bound timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('jobs_done_drop_partition'));
    part := to_regclass(partition_name);
    IF part IS NULL OR NOT EXISTS (
        SELECT 1 FROM pg_inherits
        WHERE inhrelid = part AND inhparent = 'jobs_done'::regclass
    ) THEN
        RETURN 'gone';
    END IF;
    bound := jobs_done_partition_upper_bound(part);
    IF bound IS NULL OR bound > cutoff THEN
        RETURN 'young';
    END IF;
    PERFORM set_config('lock_timeout', greatest(lock_timeout_ms, 1)::text || 'ms', true);
    BEGIN
        EXECUTE format('DROP TABLE %s', part);
    EXCEPTION WHEN lock_not_available THEN
        RETURN 'busy';
    END;
    RETURN 'dropped';
END $$;

-- Concurrency keys: a job may name a key (`concurrency_key`), and a key may
-- carry limits (a row here): at most `max_in_flight` of its jobs
-- processing, claims of its jobs at most `per_second`, none while
-- `paused_until` is ahead. A library user's "per tenant" or "per API" limit;
-- the order service's "per webhook endpoint".
--
-- One row per key ever used by a keyed job (the enqueue inserts it) or
-- given a limit. The limit columns are what the application sets
-- (NULL: no such limit); the rest is the queue's own bookkeeping, written
-- only by the statements that claim a keyed job or end its claim.
CREATE TABLE job_concurrency_keys (
    key           text             PRIMARY KEY,
    max_in_flight int              NULL,
    per_second    double precision NULL,
    -- No job of the key is claimed before this time ('infinity': until the
    -- application changes it).
    paused_until  timestamptz      NULL,
    -- The key's jobs in 'processing': +1 for each claim, -1 for each claim
    -- that ends (finish, release, reap), in the statement that moves the
    -- job, under its fencing token, so each claim gives its slot back once.
    in_flight     int              NOT NULL DEFAULT 0,
    -- The token bucket of `per_second`: `tokens` as of `tokens_at` (NULL:
    -- full). It refills at per_second up to its capacity (claim_jobs.sql).
    tokens        double precision NULL,
    tokens_at     timestamptz      NOT NULL DEFAULT now(),
    -- When the claim last took a job of this key: keys are served least
    -- recently served first, so a busy key cannot starve the others.
    served_at     timestamptz      NOT NULL DEFAULT '-infinity',
    CONSTRAINT job_concurrency_keys_max_in_flight_positive
        CHECK (max_in_flight IS NULL OR max_in_flight > 0),
    CONSTRAINT job_concurrency_keys_per_second_positive
        CHECK (per_second IS NULL OR (per_second > 0 AND per_second < 'Infinity')),
    -- A slot given back twice would let a key run past its limit: fail
    -- loudly instead.
    CONSTRAINT job_concurrency_keys_in_flight_not_negative CHECK (in_flight >= 0)
);

-- The claim's walk over the keys: least recently served first.
CREATE INDEX job_concurrency_keys_served_idx ON job_concurrency_keys (served_at, key);

-- Gives concurrency slots back: one for each entry of `ended_keys` (a key
-- appears once per claim that ended). The one definition of the release that
-- finish_jobs.sql, hand_back_jobs.sql and update_reaped_jobs.sql each call with
-- the keys of the claims their fenced write ended, so a slot comes back
-- exactly once: only the write that moved a row out of 'processing' under
-- its claim's token returns it, and a zombie's late outcome ends nothing.
--
-- The key rows are locked in key order first (`key_locks`, forced to run
-- before the UPDATE by the scalar subquery): two completers, or a completer
-- and a reaper, freeing the same keys wait on each other in one order and
-- cannot deadlock. A claim holds a key row for one statement and never waits,
-- so the wait here is short. Callers skip the call when no key ended, so a
-- batch without keyed jobs probes no key row.
CREATE FUNCTION jobs_free_concurrency_slots(ended_keys text[]) RETURNS integer
LANGUAGE sql VOLATILE AS $$
    WITH ended AS (
        SELECT key, count(*) AS n
        FROM unnest(ended_keys) AS key
        WHERE key IS NOT NULL
        GROUP BY key
    ),
    key_locks AS (
        SELECT k.key
        FROM job_concurrency_keys AS k
        WHERE k.key = ANY (ARRAY(SELECT key FROM ended))
        ORDER BY k.key
        FOR NO KEY UPDATE OF k
    ),
    freed AS (
        UPDATE job_concurrency_keys AS k
        SET in_flight = k.in_flight - e.n
        FROM ended AS e
        WHERE k.key = e.key
          AND (SELECT count(*) FROM key_locks) >= 0
        RETURNING k.key
    )
    SELECT count(*)::integer FROM freed
$$;

-- When a job whose claim ended runs again: after its backoff when the claim
-- ended in a retry ('pending'), never again otherwise (its run_after is kept
-- as a record). The one definition finish_jobs.sql and update_reaped_jobs.sql
-- both write, so a retry's delay means the same whether the relay or the
-- reaper ended the claim. A one-expression SQL function: PostgreSQL inlines
-- it into the statement, so it costs nothing per row.
CREATE FUNCTION jobs_run_again_at(next_status text, delay_ms bigint, kept timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN next_status = 'pending'
                THEN now() + delay_ms * interval '1 millisecond'
                ELSE kept END
$$;

-- The inbox: each message received from a sender, once. An application
-- records (source, message_id) in the transaction that applies the message
-- (outbox_core::dedupe::record_message); a repeat finds the row and changes
-- nothing. A copy received concurrently waits on the first copy's entry in
-- the unique index, and sees a repeat once that commits (or records the
-- message itself if the first rolled back).
--
-- An application may add columns of its own (what the message was, what it
-- did); the order service adds its payment columns. Rows are pruned after
-- the application's retention (received_at), which must outlast the
-- sender's retries: a message id forgotten too early is applied twice.
CREATE TABLE inbox_messages (
    id          bigserial   PRIMARY KEY,
    -- Who sent it: the application's name for the sender.
    source      text        NOT NULL,
    -- The sender's id of the message, unique per source.
    message_id  text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT inbox_messages_unique UNIQUE (source, message_id)
);

-- The retention's prune walks the oldest rows.
CREATE INDEX inbox_messages_received_at_idx ON inbox_messages (received_at);

-- Periodic jobs: what relays declared, and each slot they enqueued.
--
-- A relay declares its periodic jobs at start (outbox/periodic.rs) and, at
-- each scheduled time (a slot), enqueues the job inside a transaction that
-- first inserts (name, slot) here. The primary key is the whole guarantee
-- that a slot is enqueued once however many relays run or restart: a second
-- relay's insert of the same slot waits on the first's index entry and then
-- does nothing (or inserts, if the first rolled back). No leader is elected.

-- One row per periodic job a relay declared; `jobs schedules` lists them.
CREATE TABLE periodic_jobs (
    name        text        PRIMARY KEY,
    -- As declared, in the form Schedule::parse reads back
    -- ("every 15m", "cron 0 3 * * *").
    schedule    text        NOT NULL,
    -- The kind of the job each slot enqueues.
    kind        text        NOT NULL,
    -- The first declaration: no slot at or before it runs, so a new job
    -- waits for its first slot instead of running at once.
    declared_at timestamptz NOT NULL,
    -- The latest relay start that declared it: an old row no relay declares
    -- any more shows its age here.
    seen_at     timestamptz NOT NULL,
    CONSTRAINT periodic_jobs_name_not_empty CHECK (name <> '')
);

-- One row per slot enqueued; the newest few of each job are kept (the
-- enqueue prunes the rest in its own transaction), and the newest always,
-- since a slot is enqueued only if it is later than every slot recorded.
CREATE TABLE periodic_slots (
    name        text        NOT NULL REFERENCES periodic_jobs (name) ON DELETE CASCADE,
    slot        timestamptz NOT NULL,
    -- The job the slot enqueued; set in the same transaction as the row.
    job_id      bigint,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, slot)
);
