-- For relays that claim only some kinds (`relay --kinds confirmation_email`)
-- while other kinds have a large backlog. jobs_claim_idx walks due jobs in
-- order and would step over every pending job of the other kinds; this index
-- finds a rare kind's due jobs directly (and the planner sorts those few).
-- When the relay's own kinds are the backlog, the planner keeps the ordered
-- walk of jobs_claim_idx, which needs no sort. Only pending rows are in it, so
-- it costs one index entry per enqueue and per retry, nothing per completion.
CREATE INDEX jobs_kind_claim_idx ON jobs (kind, run_after, id) WHERE status = 'pending';
