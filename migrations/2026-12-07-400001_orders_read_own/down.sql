ALTER TABLE api_keys DROP CONSTRAINT api_keys_scopes_known;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_scopes_known CHECK (
    cardinality(scopes) > 0
    AND scopes <@ ARRAY[
        'orders:place', 'orders:read', 'orders:pay', 'orders:ship',
        'orders:deliver', 'orders:cancel', 'orders:*'
    ]::text[]
);
