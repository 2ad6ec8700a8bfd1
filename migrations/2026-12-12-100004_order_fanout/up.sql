-- How many of an event's deliveries its `order_fanout` job has written: the
-- job's place in its list of endpoints, moved in the transaction that writes
-- the next batch, so a fan-out that dies halfway carries on where it stopped
-- and writes no delivery twice. 0 for events whose own transaction wrote
-- their deliveries.
ALTER TABLE order_events ADD COLUMN fanned_out integer NOT NULL DEFAULT 0
    CHECK (fanned_out >= 0);
