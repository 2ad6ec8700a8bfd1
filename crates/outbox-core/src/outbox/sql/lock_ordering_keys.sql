-- Serialises enqueues that share an ordering key ($1, distinct and sorted, so
-- two transactions taking several keys take them in the same order and cannot
-- deadlock). Held until the enqueuing transaction ends.
--
-- Why: whether a new job must wait depends on the key's unfinished jobs; two
-- transactions enqueueing behind the same key at once would each see none of
-- the other's and both start a head. With this lock the second waits for the
-- first to commit, then sees its job.
SELECT pg_advisory_xact_lock(hashtextextended('outbox.ordering_key:' || k.key, 0))
FROM (SELECT key FROM unnest($1::text[]) WITH ORDINALITY AS u(key, n) ORDER BY n) AS k
