DROP FUNCTION jobs_run_again_at(text, bigint, timestamptz);
