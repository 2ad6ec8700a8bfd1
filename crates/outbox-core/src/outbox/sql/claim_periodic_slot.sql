-- Claims slot $2 of periodic job $1 for the calling transaction, which then
-- enqueues the slot's job: returns the slot when this transaction is the one
-- to enqueue it, no row otherwise. A slot is claimed only when it is later
-- than the job's declaration and than every slot already recorded, so a slot
-- older than one that ran (a worker pool whose clock lags) never runs after it.
--
-- Index: the primary key (name, slot), for the conflict and for the
-- newest-slot probe.
--
-- Concurrency: the primary key, not the NOT EXISTS, is what makes a slot
-- run once. Two worker pools claiming the same slot both pass the NOT EXISTS
-- (neither sees the other's uncommitted row); the second insert waits on the
-- first's index entry, then does nothing if the first committed, or inserts
-- if it rolled back (a worker pool killed mid-enqueue: its slot is still run once).
INSERT INTO periodic_slots (name, slot)
SELECT p.name, $2
FROM periodic_jobs AS p
WHERE p.name = $1
  AND $2 > p.declared_at
  AND NOT EXISTS (SELECT 1 FROM periodic_slots AS s WHERE s.name = $1 AND s.slot >= $2)
ON CONFLICT (name, slot) DO NOTHING
RETURNING slot
