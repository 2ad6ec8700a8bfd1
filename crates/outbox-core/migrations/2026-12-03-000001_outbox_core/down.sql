DROP VIEW jobs_all;
DROP FUNCTION jobs_done_drop_partition(text, timestamptz, int);
DROP FUNCTION jobs_done_partitions_before(timestamptz);
DROP FUNCTION jobs_done_partition_upper_bound(regclass);
DROP FUNCTION jobs_done_ensure_partitions(timestamptz, int);
DROP TABLE jobs_done;
DROP TABLE jobs;
DROP SEQUENCE jobs_lease_token_seq;
