DROP TABLE effect_results;
