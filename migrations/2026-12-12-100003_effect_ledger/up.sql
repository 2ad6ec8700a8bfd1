-- The effect ledger: what each job's peer answered when the job ended done.
-- A row is written by the transaction that finishes its job, after the fenced
-- finish matched (the core's local write), so it exists exactly when the job
-- is done under the claim that performed the effect: a zombie's late success
-- writes nothing. One row per job at most, hence the primary key; no foreign
-- key, since a done job lives in jobs_done, whose partitions retention drops.
CREATE TABLE effect_results (
    job_id bigint PRIMARY KEY,
    -- An email: its Message-ID and the SMTP server's reply to the message.
    message_id text,
    smtp_reply text,
    -- A webhook call: the endpoint (its name when called), the webhook-id
    -- sent, the final HTTP status and the SHA-256 (hex) of the answer's body
    -- as read (bounded).
    endpoint text,
    webhook_id text,
    status_code integer,
    answer_sha256 text,
    -- A NATS publish: the PubAck's stream, sequence and duplicate flag.
    stream text,
    stream_seq bigint,
    duplicate boolean,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT effect_results_status_code_is_http CHECK (status_code BETWEEN 100 AND 599),
    CONSTRAINT effect_results_answer_sha256_is_hex CHECK (answer_sha256 ~ '^[0-9a-f]{64}$'),
    CONSTRAINT effect_results_stream_seq_positive CHECK (stream_seq > 0)
);

COMMENT ON TABLE effect_results IS
    'The effect ledger: one row per done job, written in the transaction that finished it (GET /orders/{id}/effects).';

-- `jobs prune` deletes the answers with the done jobs they describe, by age.
CREATE INDEX effect_results_recorded_at_idx ON effect_results (recorded_at);
