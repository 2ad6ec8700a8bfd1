ALTER TABLE admin_audit DROP CONSTRAINT admin_audit_action_valid;
ALTER TABLE admin_audit ADD CONSTRAINT admin_audit_action_valid CHECK (
    action IN ('retry', 'cancel', 'endpoint.enable', 'endpoint.disable', 'endpoint.recover')
);
ALTER TABLE api_keys DROP CONSTRAINT api_keys_scopes_known;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_scopes_known CHECK (
    cardinality(scopes) > 0
    AND scopes <@ ARRAY[
        'orders:place', 'orders:read', 'orders:pay', 'orders:ship',
        'orders:deliver', 'orders:cancel', 'orders:*'
    ]::text[]
);
ALTER TABLE order_events DROP COLUMN inbox_message_id;
ALTER TABLE order_events DROP CONSTRAINT order_events_type_valid;
ALTER TABLE order_events ADD CONSTRAINT order_events_type_valid CHECK (type IN (
    'order.placed', 'order.paid', 'order.shipped', 'order.delivered', 'order.cancelled'
));
ALTER TABLE orders DROP CONSTRAINT orders_status_valid;
ALTER TABLE orders ADD CONSTRAINT orders_status_valid CHECK (
    status IN ('placed', 'paid', 'shipped', 'delivered', 'cancelled')
);
DROP INDEX inbox_messages_order_id_idx;
DROP INDEX inbox_messages_status_idx;
ALTER TABLE inbox_messages
    DROP COLUMN decided_at, DROP COLUMN payload, DROP COLUMN reason,
    DROP COLUMN status, DROP COLUMN order_id, DROP COLUMN type;
DROP TABLE sources;
