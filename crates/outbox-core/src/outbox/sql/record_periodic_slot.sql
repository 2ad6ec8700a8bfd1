-- Records the job ($3) that slot $2 of periodic job $1 enqueued, and drops
-- the job's slots older than its newest $4, in the claiming transaction.
--
-- Index: the primary key (name, slot): one probe for the update, a backward
-- walk of $4 entries for the bound, a range for the delete.
--
-- Concurrency: the claiming transaction holds the new slot's row; the
-- delete touches only older rows, which no claim reads but the newest-slot
-- probe, and the newest is never dropped. The data-modifying CTE and the
-- DELETE share one snapshot, so the DELETE never sees the UPDATE's new row
-- version, and does not need to.
WITH recorded AS (
    UPDATE periodic_slots
    SET job_id = $3
    WHERE name = $1 AND slot = $2
    RETURNING slot
)
DELETE FROM periodic_slots
WHERE name = $1
  AND slot < (SELECT s.slot
              FROM periodic_slots AS s
              WHERE s.name = $1
              ORDER BY s.slot DESC
              OFFSET $4 - 1 LIMIT 1)
