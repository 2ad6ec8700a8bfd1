-- The newest job id: where the jobs page's first window starts. The last
-- value of jobs' id sequence, live or archived: no scan (jobs_done has no
-- btree on id to take a max from). An id taken by a transaction that has not
-- committed, or rolled back, only starts the window a little high.
SELECT coalesce(pg_sequence_last_value('jobs_id_seq'::regclass), 0) AS id
