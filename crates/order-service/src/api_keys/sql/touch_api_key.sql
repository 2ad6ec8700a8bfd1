-- Moves key $1's `last_used_at` to now, unless it is already later than $2
-- (a minute ago): store.rs's `touch` says why.
UPDATE api_keys
SET last_used_at = now()
WHERE id = $1
  AND (last_used_at IS NULL OR last_used_at < $2)
