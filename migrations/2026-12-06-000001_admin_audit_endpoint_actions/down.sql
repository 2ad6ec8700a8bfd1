-- Back to retry and cancel only. NOT VALID: the endpoint actions already
-- audited stay (the log is append-only); only new rows are checked.
ALTER TABLE admin_audit DROP CONSTRAINT admin_audit_action_valid;
ALTER TABLE admin_audit ADD CONSTRAINT admin_audit_action_valid
    CHECK (action IN ('retry', 'cancel')) NOT VALID;
