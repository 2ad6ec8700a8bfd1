-- Whether an order's receipt exists, and when it was written (not the PDF).
-- Index: receipts' primary key.
SELECT created_at, length(pdf)::bigint AS bytes FROM receipts WHERE order_id = $1
