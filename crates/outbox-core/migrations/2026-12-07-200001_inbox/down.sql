DROP TABLE inbox_messages;
