-- The key whose secret's SHA-256 is $1 (`secret_sha256` is unique): an
-- index probe, on every request that presents a key.
SELECT id, scopes, expires_at, revoked_at, last_used_at
FROM api_keys
WHERE secret_sha256 = $1
LIMIT 1
