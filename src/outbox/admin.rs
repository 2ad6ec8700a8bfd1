//! Operator actions and read-outs: stats, listing, retrying failed jobs, pruning.
//! Cancelling is in `cancel`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Double, Nullable, Text};
use serde::Serialize;

use super::JobStatus;
use super::claim::millis;
use crate::schema::{jobs, jobs_all};

/// One kind's counts.
#[derive(Debug, Clone, QueryableByName, Serialize, PartialEq)]
pub struct KindStats {
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = BigInt)]
    pub pending: i64,
    #[diesel(sql_type = BigInt)]
    pub processing: i64,
    #[diesel(sql_type = BigInt)]
    pub done: i64,
    #[diesel(sql_type = BigInt)]
    pub failed: i64,
    #[diesel(sql_type = BigInt)]
    pub cancelled: i64,
    #[diesel(sql_type = BigInt)]
    pub expired_leases: i64,
    #[diesel(sql_type = Nullable<Double>)]
    pub oldest_due_pending_seconds: Option<f64>,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct QueueStats {
    pub kinds: Vec<KindStats>,
}

impl QueueStats {
    pub fn count(&self, status: JobStatus) -> i64 {
        self.kinds
            .iter()
            .map(|k| match status {
                JobStatus::Pending => k.pending,
                JobStatus::Processing => k.processing,
                JobStatus::Done => k.done,
                JobStatus::Failed => k.failed,
                JobStatus::Cancelled => k.cancelled,
            })
            .sum()
    }
    pub fn expired_leases(&self) -> i64 {
        self.kinds.iter().map(|k| k.expired_leases).sum()
    }
    pub fn oldest_due_pending_seconds(&self) -> Option<f64> {
        self.kinds
            .iter()
            .filter_map(|k| k.oldest_due_pending_seconds)
            .reduce(f64::max)
    }
}

pub fn queue_stats(conn: &mut PgConnection) -> QueryResult<QueueStats> {
    let kinds = diesel::sql_query(include_str!("sql/queue_stats.sql")).load(conn)?;
    Ok(QueueStats { kinds })
}

/// How many jobs are in each status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, QueryableByName, Serialize)]
pub struct QueueDepth {
    #[diesel(sql_type = BigInt)]
    pub pending: i64,
    #[diesel(sql_type = BigInt)]
    pub processing: i64,
    #[diesel(sql_type = BigInt)]
    pub done: i64,
    #[diesel(sql_type = BigInt)]
    pub failed: i64,
    #[diesel(sql_type = BigInt)]
    pub cancelled: i64,
}

impl QueueDepth {
    pub fn count(&self, status: JobStatus) -> i64 {
        match status {
            JobStatus::Pending => self.pending,
            JobStatus::Processing => self.processing,
            JobStatus::Done => self.done,
            JobStatus::Failed => self.failed,
            JobStatus::Cancelled => self.cancelled,
        }
    }
}

/// Jobs by status, cheaply enough to refresh every few seconds for a gauge.
/// See `sql/queue_depth.sql`.
pub fn queue_depth(conn: &mut PgConnection) -> QueryResult<QueueDepth> {
    diesel::sql_query(include_str!("sql/queue_depth.sql")).get_result(conn)
}

/// A job as operators see it, wherever it lives (selectable from `jobs_all`;
/// `list_jobs` also reads the same columns from `jobs`).
#[derive(Debug, Clone, Queryable, Selectable, Serialize)]
#[diesel(table_name = jobs_all)]
pub struct JobRow {
    pub id: i64,
    pub order_id: Option<i64>,
    pub kind: String,
    pub status: String,
    pub attempts: i32,
    pub max_attempts: i32,
    pub run_after: DateTime<Utc>,
    pub locked_by: Option<String>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
}

/// `JobRow`'s columns of `jobs` or of `jobs_all`, which has the same ones.
macro_rules! job_row_columns {
    ($table:ident) => {
        (
            $table::id,
            $table::order_id,
            $table::kind,
            $table::status,
            $table::attempts,
            $table::max_attempts,
            $table::run_after,
            $table::locked_by,
            $table::lease_expires_at,
            $table::created_at,
            $table::finished_at,
            $table::last_error,
        )
    };
}

#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub status: Option<JobStatus>,
    pub kind: Option<String>,
    pub order_id: Option<i64>,
    pub limit: i64,
}

/// Ids the first window of `list_jobs` spans; each next one is four times wider.
const FIRST_LIST_WINDOW: i64 = 10_000;

/// Newest first.
///
/// A status other than done is read from `jobs` alone, where those jobs live.
/// Otherwise the archive is read too (`jobs_all`): by order id through its
/// indexes, or else newest ids first in widening windows of ids, so that a
/// page of the newest jobs reads the newest ids of each partition (through its
/// BRIN index on id) rather than sorting the whole history.
pub fn list_jobs(conn: &mut PgConnection, filter: &JobFilter) -> QueryResult<Vec<JobRow>> {
    let limit = filter.limit.max(1);
    if filter.status.is_some_and(|s| s != JobStatus::Done) {
        let mut query = jobs::table
            .select(job_row_columns!(jobs))
            .order(jobs::id.desc())
            .limit(limit)
            .into_boxed();
        if let Some(status) = filter.status {
            query = query.filter(jobs::status.eq(status.as_str()));
        }
        if let Some(kind) = &filter.kind {
            query = query.filter(jobs::kind.eq(kind.clone()));
        }
        if let Some(order_id) = filter.order_id {
            query = query.filter(jobs::order_id.eq(order_id));
        }
        return query.load(conn);
    }
    let everywhere = |lower: Option<i64>, upper: Option<i64>, limit: i64| {
        let mut query = jobs_all::table
            .select(job_row_columns!(jobs_all))
            .order(jobs_all::id.desc())
            .limit(limit)
            .into_boxed();
        if let Some(status) = filter.status {
            query = query.filter(jobs_all::status.eq(status.as_str()));
        }
        if let Some(kind) = &filter.kind {
            query = query.filter(jobs_all::kind.eq(kind.clone()));
        }
        if let Some(order_id) = filter.order_id {
            query = query.filter(jobs_all::order_id.eq(order_id));
        }
        if let Some(lower) = lower {
            query = query.filter(jobs_all::id.ge(lower));
        }
        if let Some(upper) = upper {
            query = query.filter(jobs_all::id.lt(upper));
        }
        query
    };
    if filter.order_id.is_some() {
        return everywhere(None, None, limit).load(conn);
    }
    #[derive(QueryableByName)]
    struct Newest {
        #[diesel(sql_type = BigInt)]
        id: i64,
    }
    let newest: Newest =
        diesel::sql_query(include_str!("sql/newest_job_id.sql")).get_result(conn)?;
    let mut rows: Vec<JobRow> = Vec::new();
    let mut upper = newest.id.saturating_add(1);
    let mut span = FIRST_LIST_WINDOW;
    while (rows.len() as i64) < limit && upper > 0 {
        let lower = upper.saturating_sub(span).max(0);
        let wanted = limit - rows.len() as i64;
        rows.extend(everywhere(Some(lower), Some(upper), wanted).load(conn)?);
        upper = lower;
        span = span.saturating_mul(4);
    }
    Ok(rows)
}

/// The statuses of those of `ids` not in `found` (rows of `jobs`) that are in
/// the archive, so that a refusal names a done job as done rather than as
/// missing. Archived jobs are finished for good: nothing to lock. Reads
/// `jobs_all` only when some id was not in `jobs` (a refusal is coming).
pub(super) fn archived_statuses(
    conn: &mut PgConnection,
    ids: &[i64],
    found: &[(i64, String)],
) -> QueryResult<Vec<(i64, String)>> {
    let missing: Vec<i64> = ids
        .iter()
        .copied()
        .filter(|id| !found.iter().any(|(found_id, _)| found_id == id))
        .collect();
    if missing.is_empty() {
        return Ok(Vec::new());
    }
    jobs_all::table
        .filter(jobs_all::id.eq_any(&missing))
        .select((jobs_all::id, jobs_all::status))
        .load(conn)
}

/// Which failed jobs to put back.
#[derive(Debug, Clone)]
pub enum RetrySelection {
    Ids(Vec<i64>),
    AllFailed { kind: Option<String> },
}

/// A job named to `retry_failed_jobs` that cannot be retried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RetryRefusal {
    pub id: i64,
    /// Its current status; `None` when no such job exists.
    pub status: Option<String>,
}

impl std::fmt::Display for RetryRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.status {
            Some(status) => write!(f, "job {} is {status}, not failed", self.id),
            None => write!(f, "job {} does not exist", self.id),
        }
    }
}

/// What `retry_failed_jobs` did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RetryReport {
    /// Jobs put back to `pending`, in id order.
    pub retried: Vec<i64>,
    /// Named jobs that are not `failed`. When any is refused, nothing is retried.
    pub refused: Vec<RetryRefusal>,
}

/// Failed jobs back to `pending`, due now, attempts reset. `last_error` is kept
/// until the next attempt overwrites it.
///
/// With explicit ids it is all or nothing: if any named job is not `failed` (or
/// does not exist), nothing changes and the report lists the refusals, so an
/// operator never half-applies a command they typed with a wrong id. The named
/// rows are locked first, so a job cannot change status between the check and
/// the update.
pub fn retry_failed_jobs(
    conn: &mut PgConnection,
    selection: &RetrySelection,
) -> QueryResult<RetryReport> {
    conn.transaction(|conn| {
        let target = jobs::table.filter(jobs::status.eq(JobStatus::Failed.as_str()));
        let reset = (
            jobs::status.eq(JobStatus::Pending.as_str()),
            jobs::attempts.eq(0),
            jobs::run_after.eq(diesel::dsl::now),
            jobs::finished_at.eq(None::<DateTime<Utc>>),
            jobs::locked_by.eq(None::<String>),
            jobs::locked_at.eq(None::<DateTime<Utc>>),
            jobs::lease_expires_at.eq(None::<DateTime<Utc>>),
        );
        let mut retried: Vec<i64> = match selection {
            RetrySelection::Ids(ids) => {
                let mut ids = ids.clone();
                ids.sort_unstable();
                ids.dedup();
                let mut found: Vec<(i64, String)> = jobs::table
                    .filter(jobs::id.eq_any(&ids))
                    .select((jobs::id, jobs::status))
                    .order(jobs::id)
                    .for_update()
                    .load(conn)?;
                found.extend(archived_statuses(conn, &ids, &found)?);
                let refused: Vec<RetryRefusal> = ids
                    .iter()
                    .filter_map(
                        |id| match found.iter().find(|(found_id, _)| found_id == id) {
                            Some((_, status)) if status == JobStatus::Failed.as_str() => None,
                            Some((_, status)) => Some(RetryRefusal {
                                id: *id,
                                status: Some(status.clone()),
                            }),
                            None => Some(RetryRefusal {
                                id: *id,
                                status: None,
                            }),
                        },
                    )
                    .collect();
                if !refused.is_empty() {
                    return Ok(RetryReport {
                        retried: Vec::new(),
                        refused,
                    });
                }
                diesel::update(target.filter(jobs::id.eq_any(&ids)))
                    .set(reset)
                    .returning(jobs::id)
                    .get_results(conn)?
            }
            RetrySelection::AllFailed { kind: Some(kind) } => {
                diesel::update(target.filter(jobs::kind.eq(kind)))
                    .set(reset)
                    .returning(jobs::id)
                    .get_results(conn)?
            }
            RetrySelection::AllFailed { kind: None } => diesel::update(target)
                .set(reset)
                .returning(jobs::id)
                .get_results(conn)?,
        };
        retried.sort_unstable();
        Ok(RetryReport {
            retried,
            refused: Vec::new(),
        })
    })
}

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

/// How long one drop may wait for its lock on `jobs_done`: every relay's
/// insert of a finished job queues behind the waiting drop for that long.
const DROP_LOCK_TIMEOUT: Duration = Duration::from_secs(2);
/// Tries per partition before it is left to the next prune.
const DROP_TRIES: u32 = 5;
/// Pause before the next try, times the tries so far: the reader holding the
/// lock gets a moment to finish while the relays' inserts flow.
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
    super::ensure_done_partitions(conn)?;
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
