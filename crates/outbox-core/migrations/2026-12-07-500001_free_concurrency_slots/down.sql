DROP FUNCTION jobs_free_concurrency_slots(text[]);
