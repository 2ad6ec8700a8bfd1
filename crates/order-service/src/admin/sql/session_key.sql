-- The dashboard's session key (primary key lookup).
SELECT secret FROM admin_secrets WHERE name = 'session_key'
