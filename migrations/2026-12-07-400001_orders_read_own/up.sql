-- `orders:read:own`: a key that reads only the orders placed with it. The
-- scopes of the contract, as api_keys_scopes_known listed them, plus it and
-- `orders:refund` (a contract scope that a newer migration may also add:
-- listing it here keeps either order of the two migrations valid).
--
-- From now on every order and every transition records the key that caused
-- it in `api_key_id` (the column existed, but was written only with an
-- Idempotency-Key); rows written before stay NULL, and a key with
-- `orders:read:own` cannot read them.
ALTER TABLE api_keys DROP CONSTRAINT api_keys_scopes_known;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_scopes_known CHECK (
    cardinality(scopes) > 0
    AND scopes <@ ARRAY[
        'orders:place', 'orders:read', 'orders:read:own', 'orders:pay',
        'orders:ship', 'orders:deliver', 'orders:cancel', 'orders:refund',
        'orders:*'
    ]::text[]
);
