-- Whether a session whose cookie verified is still honoured: present,
-- unexpired, not logged out, and used within the idle timeout ($2 seconds)
-- (primary key lookup, on every dashboard request). A live session's
-- last_used_at moves to now, but only once it is a minute old: the idle
-- timeout needs no finer grain, and most requests then write nothing.
WITH live AS (
    SELECT id, last_used_at FROM admin_sessions
    WHERE id = $1 AND revoked_at IS NULL AND expires_at > now()
      AND last_used_at > now() - make_interval(secs => $2)
), touched AS (
    UPDATE admin_sessions AS s SET last_used_at = now()
    FROM live
    WHERE s.id = live.id AND live.last_used_at < now() - interval '1 minute'
    RETURNING s.id
)
SELECT EXISTS (SELECT 1 FROM live) AS live
