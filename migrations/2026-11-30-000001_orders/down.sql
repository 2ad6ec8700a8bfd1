DROP TABLE order_items; DROP TABLE orders;
