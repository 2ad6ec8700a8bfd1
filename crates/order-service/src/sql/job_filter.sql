-- The operator's filter of jobs: one definition for every statement that
-- lists or acts on the jobs that match it (`jobs list`, the dashboard's jobs
-- page, the preview and the batches of its bulk actions). job_list.rs writes
-- it, in parentheses, where a statement names it.
-- $3 status, $4 kind, $5 order id, $6 ILIKE pattern on last_error,
-- $7 created at or after, $8 created before. A NULL matches everything (the
-- plan is made with the actual values, so a NULL's branch folds away).
    ($3::text IS NULL OR status = $3)
AND ($4::text IS NULL OR kind = $4)
AND ($5::bigint IS NULL OR order_id = $5)
AND ($6::text IS NULL OR last_error ILIKE $6)
AND ($7::timestamptz IS NULL OR created_at >= $7)
AND ($8::timestamptz IS NULL OR created_at < $8)
