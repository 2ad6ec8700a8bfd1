-- Makes sure each concurrency key in $1 (sorted, distinct) has its row in
-- job_concurrency_keys, with no limits: the claim finds a key's jobs through
-- that row. Run by the enqueue before it inserts keyed jobs.
--
-- Index: the primary key. Concurrency: ON CONFLICT DO NOTHING takes no lock
-- on an existing row; it waits only while the newest version of a key's row
-- is uncommitted, which for a claim is the rest of one statement. Two
-- enqueues creating the same new keys wait on each other's insert, in the
-- same (sorted) order, so they cannot deadlock.
INSERT INTO job_concurrency_keys (key)
SELECT k FROM unnest($1::text[]) AS k
ORDER BY k
ON CONFLICT (key) DO NOTHING
