ALTER TABLE jobs RESET (fillfactor);
DROP INDEX jobs_claim_idx;
DROP INDEX jobs_kind_claim_idx;
DROP INDEX jobs_finished_idx;
DROP INDEX jobs_order_id_idx;
DROP INDEX jobs_ordering_key_idx;
INSERT INTO jobs (id, order_id, kind, payload, status, run_after, attempts, max_attempts,
                  locked_by, locked_at, lease_expires_at, created_at, finished_at, last_error,
                  lease_token, trace_context, ordering_key, blocked)
SELECT id, order_id, kind, payload, status, run_after, attempts, max_attempts, locked_by,
       locked_at, lease_expires_at, created_at, finished_at, last_error, lease_token,
       trace_context, ordering_key, blocked
FROM jobs_done;
DROP VIEW jobs_all;
DROP TABLE jobs_done;
DROP FUNCTION jobs_done_ensure_partitions(timestamptz, int);
CREATE INDEX jobs_claim_idx ON jobs (run_after, id) WHERE status = 'pending' AND NOT blocked;
CREATE INDEX jobs_kind_claim_idx ON jobs (kind, run_after, id) WHERE status = 'pending' AND NOT blocked;
CREATE INDEX jobs_lease_idx ON jobs (lease_expires_at) WHERE status = 'processing';
CREATE INDEX jobs_order_id_idx ON jobs (order_id);
CREATE INDEX jobs_done_finished_at_idx ON jobs (finished_at) WHERE status = 'done';
CREATE INDEX jobs_failed_idx ON jobs (id) WHERE status = 'failed';
CREATE INDEX jobs_failed_finished_at_idx ON jobs (finished_at) WHERE status = 'failed';
CREATE INDEX jobs_cancelled_finished_at_idx ON jobs (finished_at) WHERE status = 'cancelled';
CREATE INDEX jobs_ordering_key_idx ON jobs (ordering_key, id)
    WHERE ordering_key IS NOT NULL AND status IN ('pending', 'processing', 'failed');
