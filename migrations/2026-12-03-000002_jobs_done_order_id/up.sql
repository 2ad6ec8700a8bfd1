-- The queue core (crates/outbox-core) knows nothing of orders: it writes
-- only its own columns of `jobs` and `jobs_done`. `order_id` is this
-- service's column. The service writes it on enqueue itself (its
-- `InsertJobs`, effects::jobs::insert_order_jobs, from the job's `order_id`
-- argument, which every order job carries). On the move to the archive,
-- which is the core's finishing statement and copies only the core's
-- columns, this trigger sets it the same way.
--
-- It fires only for payloads that have an `order_id` (the WHEN clause is
-- checked without calling the function), so jobs of other kinds, such as the
-- benchmark's noop jobs, cost nothing; and it links a job only to an order
-- that exists, so the archive agrees with `jobs` on which jobs belong to an
-- order.
CREATE FUNCTION jobs_order_id_from_payload() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wanted numeric;
BEGIN
    IF jsonb_typeof(NEW.payload -> 'order_id') = 'number' THEN
        wanted := (NEW.payload ->> 'order_id')::numeric;
        -- Compared as bigint, so the lookup is a probe of orders_pkey: an
        -- `id = numeric` comparison would cast every id and scan the table.
        IF wanted = trunc(wanted) AND wanted BETWEEN 1 AND 9223372036854775807 THEN
            SELECT o.id INTO NEW.order_id
            FROM orders AS o
            WHERE o.id = wanted::bigint;
        END IF;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER jobs_done_order_id_from_payload
    BEFORE INSERT ON jobs_done
    FOR EACH ROW
    WHEN (NEW.order_id IS NULL AND NEW.payload ? 'order_id')
    EXECUTE FUNCTION jobs_order_id_from_payload();

-- This database already holds the core's schema, built by the migrations
-- before this one: record the core's baseline as applied, so that running
-- the core's migrations after this service's applies only what the core
-- adds later.
INSERT INTO __diesel_schema_migrations (version) VALUES ('20261203000001')
ON CONFLICT DO NOTHING;
