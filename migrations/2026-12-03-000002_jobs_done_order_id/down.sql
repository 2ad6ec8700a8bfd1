DELETE FROM __diesel_schema_migrations WHERE version = '20261203000001';
DROP TRIGGER jobs_done_order_id_from_payload ON jobs_done;
DROP FUNCTION jobs_order_id_from_payload();
