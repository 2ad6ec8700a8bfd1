-- The next placed order whose payment window has passed, locked for its
-- `expire` transition in the transaction that runs it.
--
-- Index: orders_expiry_due_idx, (expires_at) over placed orders with a
-- window only. The scan starts at the oldest expires_at and stops at the
-- first row it can lock, so a sweep reads the due orders and nothing else,
-- however many orders the table holds.
--
-- Concurrency: FOR NO KEY UPDATE is the lock every transition takes, so an
-- order being paid or cancelled right now is skipped, not waited for; when
-- that transaction commits the order has left `placed` (and the index). A
-- row another relay's sweep holds is skipped too, so sweeps running at once
-- share the due orders instead of queueing on them. A row updated after
-- this statement's snapshot is re-checked against the WHERE clause once
-- locked, so a payment that committed meanwhile is never expired.
--
-- $1: orders this sweep failed to expire, passed over until the next one.
SELECT id, expires_at
FROM orders
WHERE status = 'placed'
  AND expires_at IS NOT NULL
  AND expires_at <= now()
  AND id <> ALL ($1::bigint[])
ORDER BY expires_at
LIMIT 1
FOR NO KEY UPDATE SKIP LOCKED
