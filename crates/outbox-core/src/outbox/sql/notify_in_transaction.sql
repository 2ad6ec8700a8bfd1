-- Wakes the worker pools of each kind in $2 on channel $1 (the payload is the kind).
-- PostgreSQL delivers it when the enclosing transaction commits, and not at
-- all if it rolls back, so a worker pool never wakes for a job it cannot see. The
-- price is PostgreSQL's notify lock, held by every notifying transaction
-- through its commit's WAL flush: callers with many concurrent enqueues wake
-- worker pools after commit instead (outbox/wake.rs, notify_kinds.sql).
SELECT pg_notify($1, kind) FROM unnest($2::text[]) AS kind
