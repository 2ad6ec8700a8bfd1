-- Jobs by status, for the outbox_jobs{status} gauge (refreshed every few
-- seconds, so it must stay cheap however large the table grows).
--
-- Indexes: each count filters on exactly the predicate of a partial index
-- (jobs_claim_idx for pending, jobs_lease_idx for processing,
-- jobs_done_finished_at_idx for done, jobs_failed_idx for failed,
-- jobs_cancelled_finished_at_idx for cancelled), so the
-- planner can answer each from its index instead of scanning the whole heap;
-- one GROUP BY over the table would read every done job on every refresh.
--
-- Read-only, no locks: five counts under one snapshot.
SELECT (SELECT count(*) FROM jobs WHERE status = 'pending')    AS pending,
       (SELECT count(*) FROM jobs WHERE status = 'processing') AS processing,
       (SELECT count(*) FROM jobs WHERE status = 'done')       AS done,
       (SELECT count(*) FROM jobs WHERE status = 'failed')     AS failed,
       (SELECT count(*) FROM jobs WHERE status = 'cancelled')  AS cancelled
