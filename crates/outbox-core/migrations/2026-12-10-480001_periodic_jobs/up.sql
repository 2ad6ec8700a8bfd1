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
