-- Sessions past their expiry can never be honoured again; run at each login,
-- bounded so one login never does much (admin_sessions_expires_at_idx).
DELETE FROM admin_sessions
WHERE id IN (
    SELECT id FROM admin_sessions WHERE expires_at < now() ORDER BY expires_at LIMIT 1000
)
