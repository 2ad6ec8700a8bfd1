-- The overview's single numbers: the age of the oldest due pending job, the
-- expired leases, and the table's estimated size.
--
-- Indexes: min(run_after) of due claimable pending jobs (not waiting behind
-- their ordering key: those wait for an operator or a predecessor, not for a
-- relay) is the first entry of jobs_claim_idx; expired leases are a range of jobs_lease_idx; the size is
-- the planner's estimate in pg_class (no scan at all; -1 before the first
-- ANALYZE, shown as unknown).
SELECT extract(epoch FROM now() - (SELECT min(run_after) FROM jobs
                                   WHERE status = 'pending' AND NOT blocked
                                     AND run_after <= now()))::float8
           AS oldest_due_pending_seconds,
       (SELECT count(*) FROM jobs
        WHERE status = 'processing' AND lease_expires_at < now()) AS expired_leases,
       (SELECT reltuples::bigint FROM pg_class WHERE oid = 'jobs'::regclass) AS estimated_rows
