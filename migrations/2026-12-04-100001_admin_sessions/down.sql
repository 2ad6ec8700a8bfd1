DROP TABLE IF EXISTS admin_sessions;
DROP TABLE IF EXISTS admin_secrets;
