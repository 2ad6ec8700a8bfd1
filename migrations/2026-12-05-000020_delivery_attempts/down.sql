DROP TABLE delivery_attempts;
