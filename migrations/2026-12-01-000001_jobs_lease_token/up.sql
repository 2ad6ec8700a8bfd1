-- A fencing token per claim (the README, "Guarantees"). The old fence,
-- (locked_by, attempts), could repeat:
-- a release lowers attempts, `jobs retry` resets them, a claim committed with
-- synchronous_commit = off can be lost in a server crash and made again with
-- the same pair, and two containers can share a hostname-pid worker id. A
-- sequence never hands out a value twice, across crashes included (nextval is
-- not transactional and the sequence's WAL is flushed ahead of any commit that
-- used it), so every claim gets a token no earlier or later claim ever had.
CREATE SEQUENCE jobs_lease_token_seq AS bigint;

-- Set by every claim, kept after the job leaves 'processing' (for the record of
-- which claim finished it); NULL only for jobs never claimed.
ALTER TABLE jobs ADD COLUMN lease_token bigint NULL;

-- 'cancelled': an operator gave up on a job. Terminal, like 'done'.
ALTER TABLE jobs DROP CONSTRAINT jobs_status_valid;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_valid
    CHECK (status IN ('pending', 'processing', 'done', 'failed', 'cancelled'));

-- A processing job always carries the token of the claim that holds it: every
-- fenced statement compares against it.
ALTER TABLE jobs DROP CONSTRAINT jobs_processing_has_lease;
ALTER TABLE jobs ADD CONSTRAINT jobs_processing_has_lease CHECK (
    status <> 'processing'
    OR (locked_by IS NOT NULL AND lease_expires_at IS NOT NULL AND lease_token IS NOT NULL)
);
