-- Order expiry (ORDER_PAYMENT_WINDOW): an order placed under a payment
-- window carries the time it expires unless paid; a relay's sweep moves it
-- placed -> expired, with the event `order.expired`.
--
-- `expires_at` is set by the placing transaction (created_at + the window
-- in force then) and cleared by every transition out of `placed`, so it is
-- non-NULL only on orders that still await payment under a window.
ALTER TABLE orders ADD COLUMN expires_at timestamptz NULL;
ALTER TABLE orders ADD CONSTRAINT orders_expires_only_while_placed
    CHECK (expires_at IS NULL OR status = 'placed');

COMMENT ON COLUMN orders.expires_at IS
    'When this placed order expires unless paid (ORDER_PAYMENT_WINDOW at placing); NULL otherwise.';

ALTER TABLE orders DROP CONSTRAINT orders_status_valid;
ALTER TABLE orders ADD CONSTRAINT orders_status_valid CHECK (
    status IN ('placed', 'paid', 'shipped', 'delivered', 'cancelled', 'refunded', 'expired')
);
ALTER TABLE order_events DROP CONSTRAINT order_events_type_valid;
ALTER TABLE order_events ADD CONSTRAINT order_events_type_valid CHECK (type IN (
    'order.placed', 'order.paid', 'order.shipped', 'order.delivered', 'order.cancelled',
    'order.refunded', 'order.expired'
));

-- The sweep's index: only orders awaiting payment under a window are in it,
-- and each leaves it when paid, cancelled or expired. So the sweep reads the
-- due ones in expires_at order and touches nothing else, however many orders
-- the table holds; placing an order without a window adds no entry.
CREATE INDEX orders_expiry_due_idx ON orders (expires_at)
    WHERE status = 'placed' AND expires_at IS NOT NULL;
