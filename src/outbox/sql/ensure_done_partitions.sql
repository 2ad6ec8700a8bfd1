-- Makes sure jobs_done has its daily partitions from yesterday (UTC) through
-- two days ahead, moving any of their rows out of jobs_done_default first.
-- `jobs prune` runs it before it looks for partitions to drop, so that rows of
-- a day that had no partition when they finished are found in theirs.
--
-- Safe with many callers: the function serialises itself on an advisory lock
-- and creates only what is missing (usually nothing: the relay keeps them).
SELECT jobs_done_ensure_partitions(now() - interval '1 day', 2) AS made
