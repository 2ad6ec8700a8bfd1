-- With the message's turn held (claim_turn.sql): the id of its committed
-- row when it was recorded before (a repeat), else the id its row will
-- have, drawn from the table's own sequence. On inbox_messages_unique.
--
-- Safe with many receivers: a copy that waited for the turn runs this once
-- the first copy's transaction has ended, with a snapshot taken after it
-- (READ COMMITTED), so it sees that copy's row when it committed and none
-- when it rolled back. COALESCE draws from the sequence only for a new
-- message.
SELECT coalesce(r.id, nextval(pg_get_serial_sequence('inbox_messages', 'id'))) AS id,
       r.id IS NOT NULL AS recorded
FROM (
    SELECT (SELECT id FROM inbox_messages WHERE source = $1 AND message_id = $2) AS id
) AS r
