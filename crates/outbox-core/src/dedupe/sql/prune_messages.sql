-- Deletes up to $2 messages received before $1, oldest first, on
-- inbox_messages_received_at_idx. Each call is its own short statement, so a
-- large backlog never holds a long transaction; a receiver recording a
-- message meanwhile touches only new rows.
DELETE FROM inbox_messages
WHERE id IN (
    SELECT id FROM inbox_messages
    WHERE received_at < $1
    ORDER BY received_at
    LIMIT $2
)
