ALTER TABLE jobs DROP CONSTRAINT jobs_processing_has_lease;
ALTER TABLE jobs ADD CONSTRAINT jobs_processing_has_lease CHECK (
    status <> 'processing' OR (locked_by IS NOT NULL AND lease_expires_at IS NOT NULL)
);
UPDATE jobs SET status = 'failed' WHERE status = 'cancelled';
ALTER TABLE jobs DROP CONSTRAINT jobs_status_valid;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_valid
    CHECK (status IN ('pending', 'processing', 'done', 'failed'));
ALTER TABLE jobs DROP COLUMN lease_token;
DROP SEQUENCE jobs_lease_token_seq;
