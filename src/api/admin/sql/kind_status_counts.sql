-- The overview's table of jobs by kind and status.
--
-- Indexes: each branch filters on exactly one partial index's predicate, so
-- none reads the table's finished history: claimable pending jobs from
-- jobs_kind_claim_idx (kind first), pending jobs waiting behind their ordering
-- key from jobs_ordering_key_idx (its predicate is implied by the branch's;
-- `ordering_key IS NOT NULL` is always true of a blocked job), processing from jobs_lease_idx, failed from
-- jobs_failed_idx, and done and cancelled only for the last hour, from
-- jobs_done_finished_at_idx and jobs_cancelled_finished_at_idx. All-time done
-- counts are what would scan millions of rows, so the page does not show them
-- (the table's estimated size comes from pg_class instead).
--
-- Read-only, under the dashboard's statement_timeout.
SELECT kind, 'pending' AS status, count(*) AS n
FROM jobs WHERE status = 'pending' AND NOT blocked GROUP BY kind
UNION ALL
SELECT kind, 'blocked', count(*)
FROM jobs WHERE status = 'pending' AND blocked AND ordering_key IS NOT NULL GROUP BY kind
UNION ALL
SELECT kind, 'processing', count(*)
FROM jobs WHERE status = 'processing' GROUP BY kind
UNION ALL
SELECT kind, 'failed', count(*)
FROM jobs WHERE status = 'failed' GROUP BY kind
UNION ALL
SELECT kind, 'done_1h', count(*)
FROM jobs WHERE status = 'done' AND finished_at > now() - interval '1 hour' GROUP BY kind
UNION ALL
SELECT kind, 'cancelled_1h', count(*)
FROM jobs WHERE status = 'cancelled' AND finished_at > now() - interval '1 hour' GROUP BY kind
