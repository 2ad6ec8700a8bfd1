-- The newest entries of the audit log. Index: admin_audit_at_idx.
SELECT id, at, actor, action, target::text AS target, affected
FROM admin_audit
ORDER BY at DESC, id DESC
LIMIT $1
