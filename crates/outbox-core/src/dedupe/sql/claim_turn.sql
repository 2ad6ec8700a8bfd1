-- Takes the message's turn: a transaction-scoped advisory lock on
-- (source, message_id), held until the caller's transaction ends. A copy
-- claimed concurrently waits here until the first copy's transaction
-- commits or rolls back. The key is a hash of both (the source's length
-- first, so no two pairs concatenate alike); two messages whose hashes
-- collide only wait for each other. Its own statement: the lookup after it
-- (claim_message.sql) must take its snapshot once the turn is held.
SELECT pg_advisory_xact_lock(
    hashtextextended('outbox.inbox:' || length($1) || ':' || $1 || $2, 0)
)
