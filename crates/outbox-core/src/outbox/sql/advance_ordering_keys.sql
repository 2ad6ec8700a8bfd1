-- Releases the next job of each ordering key in $1 whose earlier jobs are all
-- finished (done or cancelled): it becomes claimable. For the operator's cancel,
-- which runs this as its own statement after cancelling, so its snapshot sees
-- every enqueue that committed before (see lock_ordering_heads.sql).
--
-- Index: jobs_ordering_key_idx, one probe per key.
UPDATE jobs AS n
SET blocked = false
FROM unnest($1::text[]) AS k(key)
WHERE n.id = (SELECT m.id
              FROM jobs AS m
              WHERE m.ordering_key = k.key
                AND m.status IN ('pending', 'processing', 'failed')
              ORDER BY m.id
              LIMIT 1)
  AND n.blocked
RETURNING n.id
