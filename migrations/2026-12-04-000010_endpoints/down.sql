DROP TABLE endpoints;
