-- Records what the peers of a batch's jobs answered, one row per job, from
-- $1, a JSON array of rows (effects/ledger.rs), each an array in the column
-- order below. Runs in the transaction that finished those jobs done, with
-- only the rows of the finishes that matched their claims (the core's
-- finish), so each row commits with exactly one successful completion; one
-- statement for the batch, not one per job.
--
-- Index: effect_results' primary key (job_id). A job ends done once, so a
-- conflict means a row written by hand; ON CONFLICT keeps the first row and
-- the rest of the batch, instead of failing every outcome written with it.
INSERT INTO effect_results (job_id, message_id, smtp_reply, endpoint, webhook_id,
                            status_code, answer_sha256, stream, stream_seq, duplicate)
SELECT (r ->> 0)::bigint, r ->> 1, r ->> 2, r ->> 3, r ->> 4,
       (r ->> 5)::integer, r ->> 6, r ->> 7, (r ->> 8)::bigint, (r ->> 9)::boolean
FROM jsonb_array_elements($1) AS r
ON CONFLICT (job_id) DO NOTHING
