-- Makes sure each concurrency key in $1 (sorted, distinct) has its row in
-- job_concurrency_keys, with no limits: the claim finds a key's jobs through
-- that row. Run by the enqueue before it inserts keyed jobs.
--
-- Index: the primary key. Concurrency: a key's row almost always exists, and
-- claims, finishes, releases and the reaper update it. ON CONFLICT alone would
-- wait for any such update still uncommitted (a finish runs with the
-- application's own writes), so existing keys are skipped by a plain read
-- first, which never waits; ON CONFLICT DO NOTHING is left for keys another
-- transaction creates at the same moment. Two enqueues creating the same new
-- keys wait on each other's insert, in the same (sorted) order, so they
-- cannot deadlock.
INSERT INTO job_concurrency_keys (key)
SELECT k FROM unnest($1::text[]) AS k
WHERE NOT EXISTS (SELECT 1 FROM job_concurrency_keys AS c WHERE c.key = k)
ORDER BY k
ON CONFLICT (key) DO NOTHING
