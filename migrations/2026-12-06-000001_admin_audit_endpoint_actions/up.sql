-- The dashboard also enables, disables and recovers endpoints, and audits each
-- like a retry or a cancel. `affected` counts the jobs an action changed: the
-- deliveries a recovery put back, none for enabling or disabling (they change
-- the endpoint; its deliveries go on, or wait, as they are).
--
-- admin_audit is small (one row per operator action), so checking its rows
-- under the ALTER's lock takes no time worth avoiding.
ALTER TABLE admin_audit DROP CONSTRAINT admin_audit_action_valid;
ALTER TABLE admin_audit ADD CONSTRAINT admin_audit_action_valid CHECK (
    action IN ('retry', 'cancel', 'endpoint.enable', 'endpoint.disable', 'endpoint.recover')
);
