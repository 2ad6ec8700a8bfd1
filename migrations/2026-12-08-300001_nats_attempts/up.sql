-- NATS publishes are delivery attempts too (`order_publish` jobs). A publish
-- has no HTTP status: its answer is the stream's PubAck, whose sequence is
-- kept here (NULL for a webhook call, or a publish that got no PubAck).
ALTER TABLE delivery_attempts ADD COLUMN stream_sequence bigint;

COMMENT ON COLUMN delivery_attempts.stream_sequence IS
    'A NATS publish: the stream sequence of its PubAck (the original one for a duplicate).';
