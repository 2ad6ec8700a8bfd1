DROP FUNCTION jobs_done_drop_partition(text, timestamptz, int);
DROP FUNCTION jobs_done_partitions_before(timestamptz);
DROP FUNCTION jobs_done_partition_upper_bound(regclass);
