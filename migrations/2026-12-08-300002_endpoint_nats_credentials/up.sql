-- A NATS endpoint's own credentials, presented only to its server: a
-- `.creds` file's content (user JWT and nkey seed), a user and password, or
-- a token, as JSON text (`{"creds": "..."}`, `{"user": "...", "password":
-- "..."}`, `{"token": "..."}`). NULL: the relay's NATS_CREDENTIALS, if any.
-- Never read back by the CLI or the dashboard, which say only whether it is
-- set. Text, so that encryption at rest can wrap it as it wraps the secrets.
ALTER TABLE endpoints ADD COLUMN nats_credentials text;

ALTER TABLE endpoints ADD CONSTRAINT endpoints_nats_credentials_nats_only CHECK (
    nats_credentials IS NULL OR stream IS NOT NULL
);
