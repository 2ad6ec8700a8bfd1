-- A new dashboard session at login; its id is fresh randomness, so it never
-- collides with another replica's.
INSERT INTO admin_sessions (id, actor, expires_at)
VALUES ($1, $2, now() + make_interval(secs => $3))
