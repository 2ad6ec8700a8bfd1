ALTER TABLE event_type_subscribers
    DROP COLUMN endpoint_count,
    DROP COLUMN webhook_runs,
    DROP COLUMN nats_runs;
DROP FUNCTION endpoint_id_runs(bigint[]);
