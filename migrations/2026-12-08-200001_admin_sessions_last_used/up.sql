-- When a dashboard session was last used: one unused for longer than
-- ADMIN_SESSION_IDLE is refused. Moved forward at most once a minute per
-- session. Sessions open before this column existed count from now.
ALTER TABLE admin_sessions ADD COLUMN last_used_at timestamptz NOT NULL DEFAULT now();
