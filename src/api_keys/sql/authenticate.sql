-- The key with this SHA-256 ($1), and whether it is usable now; in the same
-- statement, its last_used_at is moved to now() when it is more than a
-- minute old. One probe of api_keys_secret_sha256_unique.
--
-- The update writes at most about once a minute per key, not once per
-- request: a write per request would add a WAL record and a commit flush to
-- every request. Two requests that race at the minute both try; the second
-- waits for the first's row lock, re-reads the row, finds last_used_at fresh
-- (the condition is on the table, not on `k`, so it is re-checked) and
-- writes nothing. A key that is revoked or expired is not touched: its
-- last_used_at says when it last worked.
WITH k AS (
    SELECT id, scopes, revoked_at IS NOT NULL AS revoked,
           coalesce(expires_at <= now(), false) AS expired
    FROM api_keys
    WHERE secret_sha256 = $1
), touched AS (
    UPDATE api_keys
    SET last_used_at = now()
    FROM k
    WHERE api_keys.id = k.id
      AND NOT k.revoked AND NOT k.expired
      AND (api_keys.last_used_at IS NULL
           OR api_keys.last_used_at < now() - interval '1 minute')
    RETURNING api_keys.id
)
SELECT id, scopes, revoked, expired FROM k
