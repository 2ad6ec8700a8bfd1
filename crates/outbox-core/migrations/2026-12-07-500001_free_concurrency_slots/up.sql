-- Gives concurrency slots back: one for each entry of `ended_keys` (a key
-- appears once per claim that ended). The one definition of the release that
-- finish_jobs.sql, hand_back_jobs.sql and update_reaped_jobs.sql each call with
-- the keys of the claims their fenced write ended, so a slot comes back
-- exactly once: only the write that moved a row out of 'processing' under
-- its claim's token returns it, and a zombie's late outcome ends nothing.
--
-- The key rows are locked in key order first (`key_locks`, forced to run
-- before the UPDATE by the scalar subquery): two completers, or a completer
-- and a reaper, freeing the same keys wait on each other in one order and
-- cannot deadlock. A claim holds a key row for one statement and never waits,
-- so the wait here is short. Callers skip the call when no key ended, so a
-- batch without keyed jobs probes no key row.
CREATE FUNCTION jobs_free_concurrency_slots(ended_keys text[]) RETURNS integer
LANGUAGE sql VOLATILE AS $$
    WITH ended AS (
        SELECT key, count(*) AS n
        FROM unnest(ended_keys) AS key
        WHERE key IS NOT NULL
        GROUP BY key
    ),
    key_locks AS (
        SELECT k.key
        FROM job_concurrency_keys AS k
        WHERE k.key = ANY (ARRAY(SELECT key FROM ended))
        ORDER BY k.key
        FOR NO KEY UPDATE OF k
    ),
    freed AS (
        UPDATE job_concurrency_keys AS k
        SET in_flight = k.in_flight - e.n
        FROM ended AS e
        WHERE k.key = e.key
          AND (SELECT count(*) FROM key_locks) >= 0
        RETURNING k.key
    )
    SELECT count(*)::integer FROM freed
$$;
