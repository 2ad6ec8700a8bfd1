-- One PDF receipt per order. Written in the same transaction that marks its
-- receipt_pdf job done, so it exists exactly once however often the job runs.
CREATE TABLE receipts (
    order_id   bigint      PRIMARY KEY REFERENCES orders (id) ON DELETE CASCADE,
    pdf        bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
