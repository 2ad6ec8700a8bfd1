ALTER TABLE delivery_attempts DROP COLUMN stream_sequence;
