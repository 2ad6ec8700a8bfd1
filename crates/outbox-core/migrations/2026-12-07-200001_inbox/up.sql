-- The inbox: each message received from a sender, once. An application
-- records (source, message_id) in the transaction that applies the message
-- (outbox_core::dedupe::record_message); a repeat finds the row and changes
-- nothing. A copy received concurrently waits on the first copy's entry in
-- the unique index, and sees a repeat once that commits (or records the
-- message itself if the first rolled back).
--
-- An application may add columns of its own (what the message was, what it
-- did); the order service adds its payment columns. Rows are pruned after
-- the application's retention (received_at), which must outlast the
-- sender's retries: a message id forgotten too early is applied twice.
CREATE TABLE inbox_messages (
    id          bigserial   PRIMARY KEY,
    -- Who sent it: the application's name for the sender.
    source      text        NOT NULL,
    -- The sender's id of the message, unique per source.
    message_id  text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT inbox_messages_unique UNIQUE (source, message_id)
);

-- The retention's prune walks the oldest rows.
CREATE INDEX inbox_messages_received_at_idx ON inbox_messages (received_at);
