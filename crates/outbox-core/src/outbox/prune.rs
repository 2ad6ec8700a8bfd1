//! Dropping old done jobs: whole daily partitions of the archive (`jobs prune`).

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use serde::Serialize;

use super::claim::millis;

/// What [`prune_done_jobs`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    /// Done jobs removed: the rows of the partitions dropped and those deleted
    /// from `jobs_done_default`.
    pub deleted: u64,
    /// Batches that deleted rows from `jobs_done_default` (the final, short or
    /// empty one included only when it deleted rows).
    pub batches: u64,
    /// Daily partitions of `jobs_done` dropped whole.
    pub partitions_dropped: u64,
    /// Partitions due for dropping whose lock did not come in any try (a long
    /// reader of `jobs_all` held it); the next prune drops them.
    pub partitions_busy: u64,
}

/// How long one drop may wait for its lock on `jobs_done`: every worker pool's
/// insert of a finished job queues behind the waiting drop for that long.
const DROP_LOCK_TIMEOUT: Duration = Duration::from_secs(2);
/// Tries per partition before it is left to the next prune.
const DROP_TRIES: u32 = 5;
/// Pause before the next try, times the tries so far: the reader holding the
/// lock gets a moment to finish while the worker pools' inserts flow.
const DROP_RETRY_PAUSE: Duration = Duration::from_millis(250);

#[derive(QueryableByName)]
struct DonePartition {
    #[diesel(sql_type = Text)]
    partition_name: String,
    #[diesel(sql_type = BigInt)]
    job_count: i64,
}

fn prunable_partitions(
    conn: &mut PgConnection,
    older_than: Duration,
) -> QueryResult<Vec<DonePartition>> {
    diesel::sql_query(include_str!("sql/prunable_done_partitions.sql"))
        .bind::<BigInt, _>(millis(older_than))
        .load(conn)
}

/// Removes the done jobs that finished more than `older_than` ago: drops each
/// daily partition of `jobs_done` whose upper bound is at or before
/// `now() - older_than`, then deletes the older rows of `jobs_done_default`,
/// `batch` rows per transaction. `progress` is called after each partition
/// and each batch with the running total.
///
/// A done job is therefore kept at least `older_than` and at most
/// `older_than` plus one day (its day's partition goes when the whole day is
/// older than that), plus the time until the next prune. Dropping a partition
/// deletes no row, so a pinned MVCC horizon (a long transaction, a lagging
/// replication slot) leaves nothing for the next prune to scan again.
///
/// First makes sure yesterday's and the next days' partitions exist, so that
/// rows which landed in the default partition for want of one move to theirs.
/// Each drop is its own short transaction that waits at most
/// `DROP_LOCK_TIMEOUT` for its lock and is tried `DROP_TRIES` times; a
/// partition that stays busy is counted in `partitions_busy`, not an error.
pub fn prune_done_jobs(
    conn: &mut PgConnection,
    older_than: Duration,
    batch: i64,
    mut progress: impl FnMut(u64),
) -> QueryResult<PruneReport> {
    let mut report = PruneReport::default();
    super::archive::ensure_done_partitions(conn)?;
    for partition in prunable_partitions(conn, older_than)? {
        match drop_partition(conn, &partition.partition_name, older_than)? {
            DropOutcome::Dropped => {
                report.partitions_dropped += 1;
                report.deleted += u64::try_from(partition.job_count).unwrap_or(0);
                progress(report.deleted);
            }
            DropOutcome::Busy => {
                tracing::warn!(
                    partition = %partition.partition_name,
                    tries = DROP_TRIES,
                    "a done-job partition stayed locked; the next prune drops it"
                );
                report.partitions_busy += 1;
            }
            DropOutcome::Skipped => {}
        }
    }
    loop {
        let deleted = diesel::sql_query(include_str!("sql/prune_done_default.sql"))
            .bind::<BigInt, _>(millis(older_than))
            .bind::<BigInt, _>(batch.max(1))
            .execute(conn)?;
        if deleted > 0 {
            report.batches += 1;
            report.deleted += deleted as u64;
            progress(report.deleted);
        }
        if (deleted as i64) < batch.max(1) {
            return Ok(report);
        }
    }
}

enum DropOutcome {
    Dropped,
    /// Gone already (a concurrent prune) or no longer old enough.
    Skipped,
    Busy,
}

fn drop_partition(
    conn: &mut PgConnection,
    name: &str,
    older_than: Duration,
) -> QueryResult<DropOutcome> {
    #[derive(QueryableByName)]
    struct Outcome {
        #[diesel(sql_type = Text)]
        outcome: String,
    }
    for attempt in 1..=DROP_TRIES {
        let row: Outcome = diesel::sql_query(include_str!("sql/drop_done_partition.sql"))
            .bind::<Text, _>(name)
            .bind::<BigInt, _>(millis(older_than))
            .bind::<diesel::sql_types::Integer, _>(
                i32::try_from(DROP_LOCK_TIMEOUT.as_millis()).unwrap_or(i32::MAX),
            )
            .get_result(conn)?;
        match row.outcome.as_str() {
            "dropped" => return Ok(DropOutcome::Dropped),
            "busy" if attempt < DROP_TRIES => std::thread::sleep(DROP_RETRY_PAUSE * attempt),
            "busy" => return Ok(DropOutcome::Busy),
            _ => return Ok(DropOutcome::Skipped),
        }
    }
    Ok(DropOutcome::Busy)
}

/// How many done jobs `prune_done_jobs` would remove now (by the database's
/// clock, as the prune itself): the rows of the partitions it would drop and
/// the old rows of `jobs_done_default`. Creates no partition, so rows of
/// yesterday still in the default partition are counted there.
pub fn count_prunable(conn: &mut PgConnection, older_than: Duration) -> QueryResult<i64> {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let in_partitions: i64 = prunable_partitions(conn, older_than)?
        .iter()
        .map(|p| p.job_count)
        .sum();
    let stray: Count = diesel::sql_query(include_str!("sql/count_prunable_default.sql"))
        .bind::<BigInt, _>(millis(older_than))
        .get_result(conn)?;
    Ok(in_partitions + stray.n)
}
