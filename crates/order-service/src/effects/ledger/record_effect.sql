-- Records what job $1's peer answered. Runs in the transaction that finished
-- the job done, and only if that fenced finish matched this claim, so the row
-- commits with exactly one successful completion.
--
-- Index: effect_results' primary key (job_id). A job ends done once, so a
-- conflict means a row written by hand; ON CONFLICT keeps the first row and
-- the rest of the batch, instead of failing every outcome written with it.
INSERT INTO effect_results (job_id, message_id, smtp_reply, endpoint, webhook_id,
                            status_code, answer_sha256, stream, stream_seq, duplicate)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (job_id) DO NOTHING
