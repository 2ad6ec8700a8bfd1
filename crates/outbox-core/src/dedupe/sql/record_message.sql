-- Records one received message, or finds it already recorded: the row's id
-- when this call recorded it, no row for a repeat. Run inside the
-- transaction that applies the message, so the record and its effect commit
-- together or not at all.
--
-- Safe with many receivers: a copy inserted concurrently waits on the first
-- copy's entry in inbox_messages_unique until that transaction ends, then
-- does nothing (it committed: a repeat) or inserts (it rolled back). Neither
-- raises a unique violation, so a race is never an error.
INSERT INTO inbox_messages (source, message_id)
VALUES ($1, $2)
ON CONFLICT (source, message_id) DO NOTHING
RETURNING id
