-- Logout: the session ends for every replica at once (primary key update).
UPDATE admin_sessions SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL
