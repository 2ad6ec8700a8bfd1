-- The overview's table of jobs by kind and status.
--
-- Indexes: each branch filters on a partial index's predicate, so none reads
-- the finished history beyond the last hour: claimable pending and processing
-- jobs from jobs_kind_claim_idx (kind first; its rows are the unfinished,
-- unblocked jobs), pending jobs waiting behind their ordering key from
-- jobs_ordering_key_idx (`ordering_key IS NOT NULL` is always true of a
-- blocked job), failed from jobs_finished_idx (it holds exactly the failed and
-- cancelled rows), cancelled in the last hour from a range of it, and done in
-- the last hour from jobs_all: the newest partition of jobs_done (pruned by
-- finished_at) through its BRIN index, plus any done row still in jobs
-- through jobs_finished_idx. All-time done counts are what would scan the
-- whole archive, so the page does not show them (the archive's estimated size
-- comes from pg_class instead, queue_health.sql).
--
-- Read-only, under the dashboard's statement_timeout.
SELECT kind, 'pending' AS status, count(*) AS n
FROM jobs WHERE finished_at IS NULL AND NOT blocked AND status = 'pending' GROUP BY kind
UNION ALL
SELECT kind, 'blocked', count(*)
FROM jobs WHERE status = 'pending' AND blocked AND ordering_key IS NOT NULL GROUP BY kind
UNION ALL
SELECT kind, 'processing', count(*)
FROM jobs WHERE finished_at IS NULL AND NOT blocked AND status = 'processing' GROUP BY kind
UNION ALL
SELECT kind, 'failed', count(*)
FROM jobs WHERE finished_at IS NOT NULL AND status = 'failed' GROUP BY kind
UNION ALL
SELECT kind, 'done_1h', count(*)
FROM jobs_all WHERE status = 'done' AND finished_at > now() - interval '1 hour' GROUP BY kind
UNION ALL
SELECT kind, 'cancelled_1h', count(*)
FROM jobs WHERE status = 'cancelled' AND finished_at > now() - interval '1 hour' GROUP BY kind
