COMMENT ON COLUMN endpoints.secret IS NULL;
COMMENT ON COLUMN endpoints.previous_secret IS NULL;
COMMENT ON COLUMN endpoints.nats_credentials IS NULL;
COMMENT ON COLUMN sources.secret IS NULL;
COMMENT ON COLUMN sources.previous_secret IS NULL;
