-- Stores the receipt of order $1. Runs in the transaction that marked the
-- order's receipt_pdf job done, and only if that fenced update matched, so the
-- receipt commits together with exactly one successful completion.
--
-- Index: receipts primary key (order_id). ON CONFLICT keeps a second writer (an
-- operator re-running a job) from failing the whole batch; the first receipt stays.
-- The EXISTS guard turns an order deleted meanwhile into "nothing to store"
-- instead of a foreign-key error that would roll back the other outcomes.
INSERT INTO receipts (order_id, pdf)
SELECT $1, $2
WHERE EXISTS (SELECT 1 FROM orders WHERE id = $1)
ON CONFLICT (order_id) DO NOTHING
