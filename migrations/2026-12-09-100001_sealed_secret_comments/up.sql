-- What the secret columns hold, for whoever reads the database directly: with
-- SECRETS_KEY set, each value is sealed (`enc:v1:<key id>:<base64>`,
-- XChaCha20-Poly1305, bound to its table, column and row id; see
-- docs/security.md); without it, or for a row written before it was set, the
-- plaintext. Comments only: the application tells the two apart by the prefix.
COMMENT ON COLUMN endpoints.secret IS
    'Signing secret(s): enc:v1:<key id>:<base64> when sealed under SECRETS_KEY, else plaintext.';
COMMENT ON COLUMN endpoints.previous_secret IS
    'The secret before the last rotation, until previous_secret_expires_at; sealed like secret.';
COMMENT ON COLUMN endpoints.nats_credentials IS
    'The NATS endpoint''s own credentials (JSON); sealed like secret. NULL: NATS_CREDENTIALS.';
COMMENT ON COLUMN sources.secret IS
    'Signing secret: enc:v1:<key id>:<base64> when sealed under SECRETS_KEY, else plaintext.';
COMMENT ON COLUMN sources.previous_secret IS
    'The secret before the last rotation, until previous_secret_expires_at; sealed like secret.';
