-- Wakes the worker pools of each kind in $2 on channel $1 (the payload is the kind),
-- in its own transaction, after the jobs' own transactions committed
-- (outbox/wake.rs says why not inside them).
--
-- synchronous_commit off for this transaction only (set_config's third
-- argument): NOTIFY assigns a transaction id, so its commit would otherwise
-- wait for a WAL flush, holding the cluster-wide notify lock all the while.
-- A wake-up lost in a crash costs a worker pool one poll interval.
WITH async_commit AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true)
)
SELECT pg_notify($1, kind)
FROM unnest($2::text[]) AS kind, async_commit
