DROP TABLE source_reconciliations;
ALTER TABLE inbox_messages DROP COLUMN via;
ALTER TABLE sources DROP COLUMN api_key;
