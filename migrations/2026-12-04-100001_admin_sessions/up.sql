-- The dashboard's own secrets, shared by every `serve` replica through the
-- database: 'session_key' signs session cookies and form tokens. It is random
-- (made by the first `serve` that needs it, INSERT … ON CONFLICT DO NOTHING,
-- so concurrent first starts agree on one), and it is not an ADMIN_TOKEN, so
-- a leaked cookie says nothing about any token. Restarts keep it, and with it
-- every open session.
CREATE TABLE admin_secrets (
    name       text        PRIMARY KEY,
    secret     bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT admin_secrets_secret_long_enough CHECK (octet_length(secret) >= 32)
);

-- One row per dashboard login. A cookie is honoured only while its row is
-- here, unexpired and not revoked: logging out sets revoked_at, and every
-- replica sees it on its next request. Rows past their expiry are deleted at
-- later logins.
CREATE TABLE admin_sessions (
    -- 128 random bits, hex; the cookie carries it with its MAC.
    id         text        PRIMARY KEY,
    -- Which token logged in ("operator#1"); tokens themselves are never stored.
    actor      text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    revoked_at timestamptz,
    CONSTRAINT admin_sessions_expire_after_creation CHECK (expires_at > created_at)
);

-- The clean-up at login deletes by expiry.
CREATE INDEX admin_sessions_expires_at_idx ON admin_sessions (expires_at);
