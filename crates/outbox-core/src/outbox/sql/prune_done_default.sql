-- Deletes up to $2 done jobs that finished before now() - $1 ms from
-- jobs_done_default, the partition that catches rows of days nobody made a
-- partition for; returns how many it deleted, so the caller loops until a
-- batch comes back short. Whole days are dropped, not deleted
-- (drop_done_partition.sql); these rows are the rare strays.
--
-- Index: none worth one. jobs_done_finished_at_brin covers the partition, but
-- the default holds few rows, so this is a short scan that stops at $2 rows.
-- Rows are addressed by ctid: the archive has no unique key, and the rows are
-- locked by the same statement, so their ctids cannot move before the DELETE.
--
-- Each batch is its own short transaction. SKIP LOCKED keeps it off any row
-- jobs_done_ensure_partitions is moving into a new partition at the moment.
DELETE FROM jobs_done_default
WHERE ctid = ANY (ARRAY(
    SELECT ctid
    FROM jobs_done_default
    WHERE finished_at < now() - $1 * interval '1 millisecond'
    LIMIT $2
    FOR UPDATE SKIP LOCKED
))
