ALTER TABLE admin_sessions DROP COLUMN last_used_at;
