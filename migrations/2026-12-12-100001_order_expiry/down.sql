DROP INDEX orders_expiry_due_idx;
-- Expired orders go back to what the older schema can hold: cancelled, with
-- their `order.expired` events kept as cancellations.
UPDATE orders SET status = 'cancelled' WHERE status = 'expired';
UPDATE order_events SET type = 'order.cancelled' WHERE type = 'order.expired';
ALTER TABLE order_events DROP CONSTRAINT order_events_type_valid;
ALTER TABLE order_events ADD CONSTRAINT order_events_type_valid CHECK (type IN (
    'order.placed', 'order.paid', 'order.shipped', 'order.delivered', 'order.cancelled',
    'order.refunded'
));
ALTER TABLE orders DROP CONSTRAINT orders_status_valid;
ALTER TABLE orders ADD CONSTRAINT orders_status_valid CHECK (
    status IN ('placed', 'paid', 'shipped', 'delivered', 'cancelled', 'refunded')
);
ALTER TABLE orders DROP CONSTRAINT orders_expires_only_while_placed;
ALTER TABLE orders DROP COLUMN expires_at;
