-- Ordering keys held up by a failed head: the head job and how many jobs wait
-- behind it. Up to $1 keys, oldest head first. Read-only.
--
-- Index: jobs_finished_idx (exactly the failed and cancelled rows, whose
-- predicate `finished_at IS NOT NULL` the query repeats) finds the heads
-- among them; jobs_ordering_key_idx counts each key's waiting jobs. Only
-- jobs is read: a failed head and the jobs behind it never leave it.
SELECT h.ordering_key, h.id, h.kind, h.payload, h.attempts, h.max_attempts, h.last_error,
       h.finished_at,
       (SELECT count(*)
        FROM jobs AS w
        WHERE w.ordering_key = h.ordering_key
          AND w.status = 'pending'
          AND w.blocked) AS waiting
FROM jobs AS h
WHERE h.finished_at IS NOT NULL
  AND h.status = 'failed'
  AND h.ordering_key IS NOT NULL
ORDER BY h.id
LIMIT $1
