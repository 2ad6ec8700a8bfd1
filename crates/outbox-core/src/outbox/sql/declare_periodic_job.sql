-- Declares a periodic job ($1 name, $2 schedule, $3 kind) at $4, the
-- declaring worker pool's clock: a new name is declared at $4, and no slot at or
-- before then runs; a known one keeps its first declaration and takes the
-- schedule and kind of the latest worker pool to start.
--
-- Index: the primary key on name.
--
-- Concurrency: worker pools that start together race on the primary key; ON
-- CONFLICT makes each declaration an insert or an update, never an error,
-- and declared_at is the first committed one's.
INSERT INTO periodic_jobs (name, schedule, kind, declared_at, seen_at)
VALUES ($1, $2, $3, $4, $4)
ON CONFLICT (name) DO UPDATE
SET schedule = EXCLUDED.schedule,
    kind = EXCLUDED.kind,
    seen_at = GREATEST(periodic_jobs.seen_at, EXCLUDED.seen_at)
