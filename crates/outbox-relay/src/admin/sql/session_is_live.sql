-- Whether a session whose cookie verified is still honoured: present,
-- unexpired, not logged out (primary key lookup, on every dashboard request).
SELECT EXISTS (
    SELECT 1 FROM admin_sessions
    WHERE id = $1 AND revoked_at IS NULL AND expires_at > now()
) AS live
