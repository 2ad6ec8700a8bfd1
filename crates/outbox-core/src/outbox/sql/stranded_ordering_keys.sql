-- Up to $1 ordering keys that have a blocked job: the candidates of the
-- reaper's sweep for keys a finish left blocked with nothing ahead of them.
-- advance_ordering_keys.sql, run next as a statement of its own (a fresh
-- snapshot), releases the head of each whose earlier jobs have all ended;
-- for the others (a running or failed head) it changes nothing. Read-only.
--
-- Why a finish can leave one: finish_jobs.sql releases a key's next job with
-- its statement snapshot, and an enqueue behind that key which commits after
-- the snapshot was taken but before the finish locks the head row (so SKIP
-- LOCKED no longer reports the head busy) is invisible to it.
--
-- Index: jobs_ordering_key_idx (keyed rows only), with `blocked` a filter.
SELECT DISTINCT b.ordering_key AS key
FROM jobs AS b
WHERE b.ordering_key IS NOT NULL
  AND b.blocked
LIMIT $1
