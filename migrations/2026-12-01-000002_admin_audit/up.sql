-- The operator dashboard's audit log: every action taken through /admin (who,
-- what, when, how many), written after the action's last batch. Append-only;
-- nothing in the application updates or deletes a row.
CREATE TABLE admin_audit (
    id         bigserial   PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    -- Which token acted ("operator#1"): tokens are secrets, never stored.
    actor      text        NOT NULL,
    -- 'retry' or 'cancel'.
    action     text        NOT NULL,
    -- What was asked for: the job ids, or the filter every matching job was taken from.
    target     jsonb       NOT NULL,
    -- Jobs the action changed.
    affected   bigint      NOT NULL,
    CONSTRAINT admin_audit_action_valid CHECK (action IN ('retry', 'cancel')),
    CONSTRAINT admin_audit_affected_not_negative CHECK (affected >= 0)
);

-- The dashboard lists the newest entries first.
CREATE INDEX admin_audit_at_idx ON admin_audit (at DESC);

-- Failed and cancelled jobs by the time they finished: the dashboard's chart of
-- failures per minute, and the outbox_jobs{status="cancelled"} gauge, read these
-- instead of scanning the table. Both statuses are rare next to 'done' (which
-- has jobs_done_finished_at_idx), so the indexes stay small and cost nothing
-- on the claim or completion path.
CREATE INDEX jobs_failed_finished_at_idx ON jobs (finished_at) WHERE status = 'failed';
CREATE INDEX jobs_cancelled_finished_at_idx ON jobs (finished_at) WHERE status = 'cancelled';
