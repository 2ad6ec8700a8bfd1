-- The newest job id, live or archived: the last value of jobs' id sequence,
-- where a list of jobs starts and the bound of a bulk action. No scan
-- (jobs_done has no btree on id to take a max from). An id taken by a
-- transaction that has not committed, or rolled back, only starts a list's
-- first window a little high.
SELECT coalesce(pg_sequence_last_value('jobs_id_seq'::regclass), 0) AS id
