<<<<<<< HEAD
-- Makes sure jobs_done has its daily partitions from yesterday through two
-- days ahead (UTC), so that finishing jobs never fall into jobs_done_default.
-- Returns how many partitions it made (0 almost always).
--
-- The function (migrations/2026-12-02-000001_jobs_layout_v2) takes an advisory
-- lock, so relays running this at once make each partition once. A partition
-- it creates is attached with ATTACH PARTITION, which needs only a SHARE
-- UPDATE EXCLUSIVE lock on jobs_done: finishing jobs keep inserting meanwhile.
=======
-- Makes sure jobs_done has its daily partitions from yesterday (UTC) through
-- two days ahead, moving any of their rows out of jobs_done_default first.
-- `jobs prune` runs it before it looks for partitions to drop, so that rows of
-- a day that had no partition when they finished are found in theirs.
--
-- Safe with many callers: the function serialises itself on an advisory lock
-- and creates only what is missing (usually nothing: the relay keeps them).
>>>>>>> reads
SELECT jobs_done_ensure_partitions(now() - interval '1 day', 2) AS made
