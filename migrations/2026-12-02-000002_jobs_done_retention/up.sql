-- Retention of the done-job archive (`jobs prune`): which daily partitions of
-- jobs_done lie wholly before a cutoff, and dropping one of them without ever
-- queueing the relay's inserts behind a long lock wait. Partition names reach
-- DDL only as regclass values read from the catalog, never as text a caller
-- typed.

-- The exclusive upper bound of a range partition of jobs_done, from its bound
-- as the catalog prints it (`FOR VALUES FROM ('...') TO ('...')`); NULL for the
-- default partition or an unbounded one, which retention never drops. The
-- printed timestamp uses the session's TimeZone and is read back under it.
CREATE FUNCTION jobs_done_partition_upper_bound(part regclass)
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz
    FROM pg_class AS c
    WHERE c.oid = part
$$;

-- The partitions of jobs_done whose upper bound is at or before `cutoff` (so
-- every row in them finished before it), oldest first, with how many rows each
-- holds. The count reads each such partition once; nothing else is read, and
-- no lock is taken on jobs_done itself.
CREATE FUNCTION jobs_done_partitions_before(cutoff timestamptz)
RETURNS TABLE (partition_name text, upper_bound timestamptz, job_count bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    p record;
BEGIN
    FOR p IN
        SELECT i.inhrelid::regclass AS part, jobs_done_partition_upper_bound(i.inhrelid) AS bound
        FROM pg_inherits AS i
        WHERE i.inhparent = 'jobs_done'::regclass
        ORDER BY bound
    LOOP
        CONTINUE WHEN p.bound IS NULL OR p.bound > cutoff;
        partition_name := p.part::text;
        upper_bound := p.bound;
        EXECUTE format('SELECT count(*) FROM %s', p.part) INTO job_count;
        RETURN NEXT;
    END LOOP;
END $$;

-- Drops one partition of jobs_done if it is still one whose upper bound is at
-- or before `cutoff`. Returns 'dropped'; 'gone' when it no longer exists (a
-- concurrent prune dropped it) or is not a partition of jobs_done; 'young'
-- when its bound is after the cutoff; 'busy' when its lock did not come within
-- `lock_timeout_ms`.
--
-- Why the timeout: DROP TABLE of a partition takes an ACCESS EXCLUSIVE lock on
-- jobs_done, and a lock request waiting in the queue blocks every later one,
-- so a drop stuck behind a long reader of jobs_all would hold up every
-- relay's insert of a finished job for as long as it waits. With the timeout
-- the wait is bounded; the caller calls again, each time in a new short
-- transaction (a statement of its own), and the drop itself is a catalog
-- change that takes milliseconds.
--
-- Concurrent prunes are serialised by an advisory lock (held only to the end
-- of this short transaction), so exactly one reports a partition dropped.
CREATE FUNCTION jobs_done_drop_partition(partition_name text, cutoff timestamptz, lock_timeout_ms int)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    part regclass;
    bound timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('jobs_done_drop_partition'));
    part := to_regclass(partition_name);
    IF part IS NULL OR NOT EXISTS (
        SELECT 1 FROM pg_inherits
        WHERE inhrelid = part AND inhparent = 'jobs_done'::regclass
    ) THEN
        RETURN 'gone';
    END IF;
    bound := jobs_done_partition_upper_bound(part);
    IF bound IS NULL OR bound > cutoff THEN
        RETURN 'young';
    END IF;
    PERFORM set_config('lock_timeout', greatest(lock_timeout_ms, 1)::text || 'ms', true);
    BEGIN
        EXECUTE format('DROP TABLE %s', part);
    EXCEPTION WHEN lock_not_available THEN
        RETURN 'busy';
    END;
    RETURN 'dropped';
END $$;
