-- One line of the audit log: who did what to how many jobs. Appended after the
-- action's last batch (or after the batch that failed), in its own statement.
INSERT INTO admin_audit (actor, action, target, affected)
VALUES ($1, $2, $3, $4)
