ALTER TABLE endpoints DROP CONSTRAINT endpoints_nats_credentials_nats_only;
ALTER TABLE endpoints DROP COLUMN nats_credentials;
