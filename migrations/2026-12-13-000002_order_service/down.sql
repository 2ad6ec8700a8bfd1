DROP TABLE effect_results;
DROP TABLE source_reconciliations;
ALTER TABLE inbox_messages
    DROP COLUMN via, DROP COLUMN decided_at, DROP COLUMN payload, DROP COLUMN reason,
    DROP COLUMN status, DROP COLUMN order_id, DROP COLUMN type;
DROP TABLE sources;
DROP TABLE delivery_attempts;
DROP TABLE api_keys;
DROP TABLE admin_sessions;
DROP TABLE admin_secrets;
DROP FUNCTION order_event_subscribers(text);
DROP TRIGGER endpoints_subscribers_refresh ON endpoints;
DROP TRIGGER endpoints_subscribers_lock ON endpoints;
DROP FUNCTION event_type_subscribers_refresh();
DROP FUNCTION event_type_subscribers_lock();
DROP TABLE event_type_subscribers;
DROP FUNCTION order_event_subscribers_now(text);
DROP TABLE endpoints;
DROP TABLE admin_audit;
-- jobs_all back to the core's columns: the view names order_id, so it goes
-- first and comes back without it.
DROP VIEW jobs_all;
DROP TRIGGER jobs_done_order_id_from_payload ON jobs_done;
DROP FUNCTION jobs_order_id_from_payload();
ALTER TABLE jobs_done DROP COLUMN order_id;
ALTER TABLE jobs DROP COLUMN order_id;
CREATE VIEW jobs_all AS
SELECT * FROM jobs
UNION ALL
SELECT * FROM jobs_done;
DROP TABLE receipts;
DROP TABLE order_events;
DROP TABLE order_items;
DROP TABLE orders;
