-- The effect ledger of order $1: one row per job of the order, wherever the
-- job lives (jobs_all: jobs and the jobs_done archive), with what its peer
-- answered when the job ended done (effect_results, written by the finishing
-- transaction) and, for the receipt, the digest of the stored PDF.
--
-- Index: jobs_order_id_idx and jobs_done_order_id_brin find the order's
-- jobs; effect_results' and endpoints' primary keys, and receipts' (order_id),
-- one probe each. Read-only: run it in the snapshot that read the order.
SELECT j.id AS job_id,
       j.kind,
       j.status,
       j.attempts,
       j.lease_token,
       r.message_id,
       r.smtp_reply,
       -- The endpoint as called; before a call, the one the job names now.
       coalesce(r.endpoint, e.name) AS endpoint,
       r.webhook_id,
       r.status_code,
       r.answer_sha256,
       r.stream,
       r.stream_seq,
       r.duplicate,
       CASE WHEN j.kind = 'receipt_pdf' AND j.status = 'done'
            THEN encode(sha256(p.pdf), 'hex') END AS pdf_sha256,
       r.recorded_at
FROM jobs_all AS j
LEFT JOIN effect_results AS r ON r.job_id = j.id
LEFT JOIN endpoints AS e
       ON e.id = CASE WHEN jsonb_typeof(j.payload -> 'endpoint_id') = 'number'
                      THEN (j.payload ->> 'endpoint_id')::bigint END
LEFT JOIN receipts AS p ON j.kind = 'receipt_pdf' AND p.order_id = j.order_id
WHERE j.order_id = $1
ORDER BY j.id
