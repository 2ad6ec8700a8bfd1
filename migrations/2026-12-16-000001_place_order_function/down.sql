DROP FUNCTION place_order(text, text, text, bigint, text, text, bigint, text[], text[], int[], bigint[], text, bigint, int, bigint, jsonb, text, text, text, text, text, text);
