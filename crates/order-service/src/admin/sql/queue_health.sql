-- The overview's single numbers: the age of the oldest due pending job, the
-- expired leases, and the estimated number of jobs (live and archived).
--
-- Indexes: min(run_after) of due claimable pending jobs (not waiting behind
-- their ordering key: those wait for an operator or a predecessor, not for a
-- relay) walks jobs_claim_idx from its first entry, stepping over the
-- processing rows it also holds; expired leases are among the processing rows
-- of jobs_claim_idx (no index is keyed on the lease, so that heartbeats stay
-- HOT updates: a read of the backlog, not of the history); the size is the
-- planner's estimate in pg_class for jobs and each partition of jobs_done (no
-- scan at all; -1 before the first ANALYZE, shown as unknown).
SELECT extract(epoch FROM now() - (SELECT min(run_after) FROM jobs
                                   WHERE finished_at IS NULL AND NOT blocked
                                     AND status = 'pending'
                                     AND run_after <= now()))::float8
           AS oldest_due_pending_seconds,
       (SELECT count(*) FROM jobs
        WHERE finished_at IS NULL AND NOT blocked
          AND status = 'processing' AND lease_expires_at < now()) AS expired_leases,
       (SELECT CASE WHEN bool_and(reltuples < 0) THEN -1
                    ELSE sum(greatest(reltuples, 0)) END::bigint
        FROM pg_class
        WHERE oid = 'jobs'::regclass
           OR oid IN (SELECT inhrelid FROM pg_inherits
                      WHERE inhparent = 'jobs_done'::regclass)) AS estimated_rows
