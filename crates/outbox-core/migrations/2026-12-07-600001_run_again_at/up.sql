-- When a job whose claim ended runs again: after its backoff when the claim
-- ended in a retry ('pending'), never again otherwise (its run_after is kept
-- as a record). The one definition finish_jobs.sql and update_reaped_jobs.sql
-- both write, so a retry's delay means the same whether the relay or the
-- reaper ended the claim. A one-expression SQL function: PostgreSQL inlines
-- it into the statement, so it costs nothing per row.
CREATE FUNCTION jobs_run_again_at(next_status text, delay_ms bigint, kept timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN next_status = 'pending'
                THEN now() + delay_ms * interval '1 millisecond'
                ELSE kept END
$$;
