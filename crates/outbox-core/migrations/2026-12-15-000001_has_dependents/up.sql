-- A parent's row says whether any job was ever enqueued to wait for it, so
-- that a finish probes jobs_waiting_on_idx only for the parents that have
-- dependents, not for every job it ends. Before this, every finish looked up
-- each of its jobs in that GIN index: PostgreSQL's GIN scan compares each
-- of a query's keys with every key before it, so the probe cost the square
-- of the batch (0.15 ms for 128 ids, 35 to 55 ms for 2,048), about 4 µs a
-- job of a 1024 / 256 drain of jobs that never have dependents
-- (docs/performance.md).
--
-- Set, never cleared. Kept in jobs_done and jobs_all too, as every column of
-- `jobs` is (the first migration's rule), and copied there by the finish.
ALTER TABLE jobs ADD COLUMN has_dependents boolean NOT NULL DEFAULT false;
ALTER TABLE jobs_done ADD COLUMN has_dependents boolean NOT NULL DEFAULT false;

CREATE OR REPLACE VIEW jobs_all AS
SELECT * FROM jobs
UNION ALL
SELECT * FROM jobs_done;

-- Whoever writes a waiting job marks its parents, whatever wrote it: the
-- library's enqueue, an application's own insert, or a placement statement,
-- and an older build of any of them still running beside this one while a
-- deployment rolls out. A parent enqueued in the same transaction is marked
-- here (or by its writer, when it knows); a parent enqueued earlier was
-- already marked by lock_dependency_parents.sql, which also writes a new
-- version of its row, so this finds it marked and writes nothing.
-- AFTER, so that a parent inserted by the same statement exists; the WHEN
-- keeps the function from being called for a job without parents.
CREATE FUNCTION jobs_mark_parents() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE jobs
    SET has_dependents = true
    WHERE id = ANY (NEW.waiting_on)
      AND NOT has_dependents;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_parents_have_dependents
    AFTER INSERT ON jobs
    FOR EACH ROW
    WHEN (NEW.waiting_on <> '{}')
    EXECUTE FUNCTION jobs_mark_parents();

-- The parents of the jobs waiting now.
UPDATE jobs AS p
SET has_dependents = true
WHERE p.id IN (SELECT unnest(c.waiting_on) FROM jobs AS c WHERE c.waiting_on <> '{}')
  AND NOT p.has_dependents;
