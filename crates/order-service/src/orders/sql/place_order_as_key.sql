-- place_order.sql for a key the API let in from its cache of keys
-- (api/key_cache.rs): the key's row is checked in the statement that places
-- the order, so a key revoked or expired since it was cached places nothing,
-- and the check costs no round trip of its own.
--
-- $1 … $22 as in place_order.sql, $7 being the key's id. $23: the scopes that
-- grant placing (the place scope and the catch-all), of which the key must
-- hold one.
--
-- No row: the key is gone, revoked, expired or no longer holds a scope that
-- grants placing; nothing was written. A row with a null order_id: the key
-- holds, and the idempotency key was taken (place_order.sql says what then).
-- Else the placement's row.
--
-- The order of the work is the plan's shape, not a hope: place_order takes
-- the key's id from the row of api_keys (k.id, LATERAL), so the function runs
-- only on the inner side of a nested loop over that row, after the WHERE has
-- filtered it at the key's scan; a key that fails it leaves nothing to join.
--
-- Index: api_keys' primary key, one probe.
SELECT k.id AS checked_key_id, p.order_id, p.created_at, p.expires_at, p.item_ids,
       p.event_id, p.job_ids, p.job_kinds, p.notified
FROM api_keys AS k
LEFT JOIN LATERAL place_order($1, $2, $3, $4, $5, $6, k.id, $8, $9, $10, $11, $12, $13, $14,
                              $15, $16, $17, $18, $19, $20, $21, $22) AS p ON true
WHERE k.id = $7
  AND k.revoked_at IS NULL
  AND (k.expires_at IS NULL OR k.expires_at > now())
  AND k.scopes && $23
