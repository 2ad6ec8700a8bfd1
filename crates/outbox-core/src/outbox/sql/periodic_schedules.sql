-- The declared periodic jobs, by name, each with its newest slot and the job
-- that slot enqueued (`jobs schedules`).
--
-- Index: the primary keys; one backward probe of periodic_slots per job.
--
-- Concurrency: a plain read; a slot whose claim has not committed shows
-- once it does.
SELECT p.name, p.schedule, p.kind, p.declared_at, p.seen_at,
       s.slot AS last_slot, s.job_id AS last_job_id
FROM periodic_jobs AS p
LEFT JOIN LATERAL (
    SELECT slot, job_id
    FROM periodic_slots
    WHERE name = p.name
    ORDER BY slot DESC
    LIMIT 1
) AS s ON true
ORDER BY p.name
