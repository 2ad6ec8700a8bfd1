-- Deletes up to $2 messages received before $1 and decided before $1 too,
-- oldest first, on inbox_messages_received_at_idx. A held message stays
-- whatever its age: it waits for an operator, and a "refund needed" must
-- not vanish with the retention. Returns what went, with the payload only
-- of an unmatched message (money for no order), which the caller names in
-- a WARN. One short statement a call; two replicas pruning at once delete
-- disjoint rows or skip those already gone. A row never becomes held after
-- it is received, so none can turn held under this delete.
DELETE FROM inbox_messages
WHERE id IN (
    SELECT id FROM inbox_messages
    WHERE received_at < $1
      AND status IS DISTINCT FROM 'held'
      AND (decided_at IS NULL OR decided_at < $1)
    ORDER BY received_at
    LIMIT $2
)
RETURNING id, source, message_id, type AS message_type, status, order_id, reason,
          CASE WHEN status = 'unmatched' THEN payload END AS payload
