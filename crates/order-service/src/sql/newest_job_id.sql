-- The newest job id, live or archived: the last value of jobs' id sequence.
-- No scan (jobs_done has no btree on id to take a max from). An id taken by a
-- transaction that has not committed, or rolled back, only makes the first
-- window of `jobs list` start a little high.
SELECT coalesce(pg_sequence_last_value('jobs_id_seq'::regclass), 0) AS id
