-- State layout v2 (ARCHITECTURE.md, "Job state"): what each job costs the
-- database over its life, and what a pinned MVCC horizon costs every claim.
--
-- 1. A job that ends `done` leaves `jobs` in the transaction that finishes it
--    and is appended to `jobs_done`, partitioned by day of finished_at.
--    Retention drops whole partitions: nothing is left for a DELETE to kill
--    and for vacuum to clean, and nothing `jobs prune` must rescan under a
--    pinned horizon. `failed` and `cancelled` jobs stay in `jobs`, where
--    operators retry them.
-- 2. No index on `jobs` mentions a column the claim or the heartbeat changes
--    (status, locked_by, locked_at, lease_expires_at, attempts, lease_token),
--    so both are HOT updates: they write a heap version and no index entry.
--    Pending and processing jobs are the ones with finished_at IS NULL. The
--    claim steps over the few processing rows still in its index (see
--    claim_jobs.sql for how it keeps from walking them, or the dead entries a
--    pinned horizon leaves, again and again).
-- 3. Fillfactor 40 leaves room on each page for every row's claimed version
--    (a claimed row is larger: lease, owner and token are filled in),
--    which a HOT update must place on the page of the version it replaces.

CREATE TABLE jobs_done (
    id               bigint      NOT NULL,
    order_id         bigint      NULL,
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
    -- Only `done` jobs move here today; failed and cancelled are allowed so that
    -- an archive of every finished job stays possible without a migration.
    CONSTRAINT jobs_done_status_finished CHECK (status IN ('done', 'failed', 'cancelled'))
) PARTITION BY RANGE (finished_at);

-- No btree and no foreign key: each would cost an entry or a lookup per
-- finished job. Rows are appended in finished_at order, so ids and order ids
-- rise with the heap: a BRIN summary per 16 pages finds a job or an order's
-- jobs by reading a few ranges, and costs nothing per row.
CREATE INDEX jobs_done_id_brin ON jobs_done USING brin (id) WITH (pages_per_range = 16, autosummarize = on);
CREATE INDEX jobs_done_order_id_brin ON jobs_done USING brin (order_id) WITH (pages_per_range = 16, autosummarize = on);
CREATE INDEX jobs_done_finished_at_brin ON jobs_done USING brin (finished_at) WITH (pages_per_range = 16, autosummarize = on);

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

-- Every job wherever it lives, with the columns of `jobs`. A job is in exactly
-- one of the two: the move is one statement in one transaction.
CREATE VIEW jobs_all AS
SELECT id, order_id, kind, payload, status, run_after, attempts, max_attempts, locked_by,
       locked_at, lease_expires_at, created_at, finished_at, last_error, lease_token,
       trace_context, ordering_key, blocked
FROM jobs
UNION ALL
SELECT id, order_id, kind, payload, status, run_after, attempts, max_attempts, locked_by,
       locked_at, lease_expires_at, created_at, finished_at, last_error, lease_token,
       trace_context, ordering_key, blocked
FROM jobs_done;

-- Done jobs already in `jobs` move to the archive.
SELECT jobs_done_ensure_partitions(coalesce(min(finished_at), now()), 2)
FROM jobs WHERE status = 'done';
WITH moved AS (
    DELETE FROM jobs WHERE status = 'done'
    RETURNING id, order_id, kind, payload, status, run_after, attempts, max_attempts,
              locked_by, locked_at, lease_expires_at, created_at, coalesce(finished_at, now()),
              last_error, lease_token, trace_context, ordering_key, blocked
)
INSERT INTO jobs_done SELECT * FROM moved;

-- The indexes of `jobs`, rebuilt so that none mentions a column the claim or
-- the heartbeat changes. Gone:
--   jobs_lease_idx (lease_expires_at) WHERE status = 'processing': the reaper
--     reads processing rows through jobs_claim_idx instead (reap).
--   jobs_done_finished_at_idx: done jobs are no longer in `jobs`.
--   jobs_failed_idx, jobs_failed_finished_at_idx, jobs_cancelled_finished_at_idx:
--     replaced by jobs_finished_idx, which holds exactly the failed and
--     cancelled rows and is keyed on nothing the hot path writes.
DROP INDEX jobs_lease_idx;
DROP INDEX jobs_done_finished_at_idx;
DROP INDEX jobs_failed_idx;
DROP INDEX jobs_failed_finished_at_idx;
DROP INDEX jobs_cancelled_finished_at_idx;
DROP INDEX jobs_claim_idx;
DROP INDEX jobs_kind_claim_idx;
DROP INDEX jobs_ordering_key_idx;
DROP INDEX jobs_order_id_idx;

-- The claim's index: pending and processing jobs (not finished), not waiting
-- behind their ordering key. The claim flips status to processing without
-- leaving it; a finish either deletes the row or sets finished_at (failed) or
-- run_after (retry), which is a regular update, rare next to the claim.
CREATE INDEX jobs_claim_idx ON jobs (run_after, id) WHERE finished_at IS NULL AND NOT blocked;
CREATE INDEX jobs_kind_claim_idx ON jobs (kind, run_after, id) WHERE finished_at IS NULL AND NOT blocked;
-- Failed and cancelled jobs by the time they ended: `jobs retry --failed`, the
-- dashboard, the gauges. Pending and processing rows are not in it.
CREATE INDEX jobs_finished_idx ON jobs (finished_at) WHERE finished_at IS NOT NULL;
-- GET /orders/{id}; jobs enqueued without an order cost it nothing.
CREATE INDEX jobs_order_id_idx ON jobs (order_id) WHERE order_id IS NOT NULL;
-- An ordering key's jobs still in `jobs`, in order (done jobs have left).
CREATE INDEX jobs_ordering_key_idx ON jobs (ordering_key, id) WHERE ordering_key IS NOT NULL;

ALTER TABLE jobs SET (fillfactor = 40);
