-- The daily partitions of jobs_done whose upper bound is at or before
-- now() - $1 ms, so that every job in them finished longer ago than that,
-- oldest first, with how many jobs each holds (for the report).
--
-- Index: none. The partitions come from the catalog (pg_inherits and each
-- partition's bound); the count reads each doomed partition once, a day of
-- history that is about to be dropped anyway. Read-only: it takes no lock on
-- jobs_done itself, only a share lock on each partition while counting it.
SELECT partition_name, upper_bound, job_count
FROM jobs_done_partitions_before(now() - $1 * interval '1 millisecond')
