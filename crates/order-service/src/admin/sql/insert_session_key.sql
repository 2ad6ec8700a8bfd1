-- The dashboard's session key, made by the first `serve` that needs it. Every
-- replica may race to make it: ON CONFLICT DO NOTHING keeps the first one, and
-- each then reads back the one that won (session_key.sql, a later statement,
-- so it sees the winner's commit).
INSERT INTO admin_secrets (name, secret)
VALUES ('session_key', $1)
ON CONFLICT (name) DO NOTHING
