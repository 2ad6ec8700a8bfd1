-- Of the ordering keys $1, those that have an unfinished job (pending,
-- processing or failed): a job enqueued now behind such a key must wait.
--
-- Index: jobs_ordering_key_idx ON jobs (ordering_key, id) WHERE ordering_key IS
-- NOT NULL (done jobs have left `jobs`; the status is a filter): one probe per key.
--
-- FOR SHARE on each key's first unfinished job (its head), held until the
-- enqueuing transaction ends: a worker pool finishing that head at this moment either
-- finished first (the lock waits for its commit, the re-check sees the head
-- done and moves on to the next unfinished job, if any) or meets the lock and
-- tries again after our commit, when it sees and releases the new job. Without
-- it, a head finishing concurrently could miss a successor it never saw. One
-- interleaving remains: a finish whose snapshot predates our commit but which
-- locks the head just after it sees neither the lock nor the new job, and
-- releases nothing; stranded_ordering_keys.sql, read by every reaper pass,
-- releases such a job within one reap interval.
SELECT k.key
FROM unnest($1::text[]) AS k(key)
CROSS JOIN LATERAL (
    SELECT j.id
    FROM jobs AS j
    WHERE j.ordering_key = k.key
      AND j.status IN ('pending', 'processing', 'failed')
    ORDER BY j.id
    LIMIT 1
    FOR SHARE OF j
) AS head
