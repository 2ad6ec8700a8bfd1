-- The queue core (crates/outbox-core) knows nothing of orders: it writes
-- only its own columns of `jobs` and `jobs_done`. `order_id` is this
-- service's column, derived from the job's arguments: every order job
-- (confirmation_email, receipt_pdf, order_webhook) carries its order as
-- `order_id` in its payload. The triggers fire only for payloads that have
-- one (the WHEN clause is checked without calling the function), so jobs of
-- other kinds, such as the benchmark's noop jobs, cost nothing.

-- Links the job to its order, if that order exists (a library user's job
-- whose payload happens to name an `order_id` of no order stays unlinked
-- rather than failing the foreign key).
CREATE FUNCTION jobs_order_id_from_payload() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF jsonb_typeof(NEW.payload -> 'order_id') = 'number' THEN
        SELECT o.id INTO NEW.order_id
        FROM orders AS o
        WHERE o.id = (NEW.payload ->> 'order_id')::numeric;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER jobs_order_id_from_payload
    BEFORE INSERT ON jobs
    FOR EACH ROW
    WHEN (NEW.order_id IS NULL AND NEW.payload ? 'order_id')
    EXECUTE FUNCTION jobs_order_id_from_payload();

-- On the move to the archive: the same link (the finishing statement copies
-- only the core's columns). The archive has no foreign key, but the lookup
-- keeps the two tables agreeing on which jobs belong to an order.
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
