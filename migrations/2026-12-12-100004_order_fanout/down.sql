ALTER TABLE order_events DROP COLUMN fanned_out;
