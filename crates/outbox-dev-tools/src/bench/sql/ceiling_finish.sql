-- The ceiling's completion of a batch in layout v2: the done jobs leave `jobs`
-- and are appended to `jobs_done` in one statement, so each job is in exactly
-- one of the two at every moment. $1 ids, $2 their lease tokens.
--
-- Index: the primary key (j.id = o.id). jobs_done has only BRIN indexes: the
-- insert costs no index entry per row.
--
-- Fencing, as in the relay: only a row still processing under the token of
-- this claim moves.
WITH moved AS (
    DELETE FROM jobs AS j
    USING unnest($1::bigint[], $2::bigint[]) AS o(id, lease_token)
    WHERE j.id = o.id
      AND j.lease_token = o.lease_token
      AND j.status = 'processing'
    RETURNING j.id, j.order_id, j.kind, j.payload, j.run_after, j.attempts, j.max_attempts,
              j.locked_by, j.locked_at, j.created_at, j.last_error, j.lease_token,
              j.trace_context, j.ordering_key
)
INSERT INTO jobs_done (id, order_id, kind, payload, status, run_after, attempts, max_attempts,
                       locked_by, locked_at, lease_expires_at, created_at, finished_at,
                       last_error, lease_token, trace_context, ordering_key, blocked)
SELECT id, order_id, kind, payload, 'done', run_after, attempts, max_attempts,
       locked_by, locked_at, NULL, created_at, now(),
       last_error, lease_token, trace_context, ordering_key, false
FROM moved
