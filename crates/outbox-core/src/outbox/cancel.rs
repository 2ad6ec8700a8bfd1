//! Cancelling jobs: an operator gives up on jobs that are not finished
//! ([`cancel_jobs`]), or an application cancels a job it scheduled, inside
//! the transaction that made it pointless ([`Enqueuer::cancel`]).
//!
//! Only `pending` and `failed` jobs can be cancelled. A `processing` job is
//! refused rather than marked: its effect may already be under way, and a
//! "cancelled" row for a message that went out would be a lie. The operator
//! waits for it to finish (or for its lease to be reaped) and cancels then.

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Nullable, Text};
use serde::Serialize;

use super::{Enqueuer, JobStatus};
use crate::schema::{jobs, jobs_all};

/// Ids per `cancel_jobs.sql` statement: each statement locks at most this many
/// rows, for the few milliseconds it runs.
pub(crate) const CANCEL_BATCH: usize = 1000;

/// A job named to `cancel_jobs` that cannot be cancelled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CancelRefusal {
    /// The job named.
    pub id: i64,
    /// Its current status (`processing`, or a terminal one: `done`,
    /// `cancelled`); `None` when no such job exists, in `jobs` or the archive.
    pub status: Option<String>,
}

impl std::fmt::Display for CancelRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status.as_deref() {
            Some("processing") => write!(
                f,
                "job {} is processing (a relay is running it; cancel it once it finishes or its lease expires)",
                self.id
            ),
            Some(status) => write!(f, "job {} is {status}: already finished", self.id),
            None => write!(f, "job {} does not exist", self.id),
        }
    }
}

/// What `cancel_jobs` did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CancelReport {
    /// Jobs now `cancelled`, in id order.
    pub cancelled: Vec<i64>,
    /// Jobs cancelled because a parent they waited for (policy `hold`) was
    /// cancelled, in id order.
    pub dependents_cancelled: Vec<i64>,
    /// Named jobs that are not pending or failed. When any is refused, nothing
    /// is cancelled.
    pub refused: Vec<CancelRefusal>,
}

#[derive(QueryableByName)]
struct Cancelled {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Nullable<Text>)]
    ordering_key: Option<String>,
}

/// Cancels the named jobs, all or nothing: if any is not `pending` or `failed`
/// (or does not exist), nothing changes and the report lists the refusals, as
/// `retry_failed_jobs` does, so a mistyped id never half-applies a command.
/// The named rows are locked first, so none changes status between the check
/// and the update. Meant for ids an operator typed; for thousands of jobs use
/// [`cancel_job_batch`] in a loop, one short transaction a batch.
pub fn cancel_jobs(conn: &mut PgConnection, ids: &[i64]) -> QueryResult<CancelReport> {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    conn.transaction(|conn| {
        let mut found: Vec<(i64, String)> = jobs::table
            .filter(jobs::id.eq_any(&ids))
            .select((jobs::id, jobs::status))
            .order(jobs::id)
            .for_update()
            .load(conn)?;
        found.extend(super::retry::archived_statuses(conn, &ids, &found)?);
        let refused: Vec<CancelRefusal> = ids
            .iter()
            .filter_map(|id| {
                let status = found.iter().find(|(found, _)| found == id).map(|(_, s)| s);
                match status.map(String::as_str) {
                    Some(s) if cancellable(s) => None,
                    _ => Some(CancelRefusal {
                        id: *id,
                        status: status.cloned(),
                    }),
                }
            })
            .collect();
        if !refused.is_empty() {
            return Ok(CancelReport {
                refused,
                ..CancelReport::default()
            });
        }
        let mut cancelled = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(CANCEL_BATCH) {
            cancelled.extend(cancel_job_batch(conn, chunk)?);
        }
        let (mut named, mut dependents): (Vec<i64>, Vec<i64>) = cancelled
            .into_iter()
            .partition(|id| ids.binary_search(id).is_ok());
        named.sort_unstable();
        dependents.sort_unstable();
        Ok(CancelReport {
            cancelled: named,
            dependents_cancelled: dependents,
            refused: Vec::new(),
        })
    })
}

/// Cancels those of `ids` (at most `CANCEL_BATCH`, 1000, of them) that are still
/// `pending` or `failed`, skipping the rest, then releases the next job of
/// each ordering key a cancelled job held (a cancelled head frees its key, as
/// `done` does), and deals with their dependents: those of policy `hold` are
/// cancelled too (and theirs, transitively), `last_error` naming the parent;
/// those of policy `run` stop waiting for it. Returns the ids it cancelled,
/// dependents included. See `sql/cancel_jobs.sql` and
/// `sql/cancel_dependents.sql`. Run it inside a transaction, so the release
/// commits with the cancel.
pub fn cancel_job_batch(conn: &mut PgConnection, ids: &[i64]) -> QueryResult<Vec<i64>> {
    let rows: Vec<Cancelled> = diesel::sql_query(include_str!("sql/cancel_jobs.sql"))
        .bind::<Array<BigInt>, _>(ids)
        .load(conn)?;
    let mut keys: Vec<String> = rows.iter().filter_map(|r| r.ordering_key.clone()).collect();
    let mut cancelled: Vec<i64> = rows.into_iter().map(|r| r.id).collect();
    let mut parents = cancelled.clone();
    // Each round cancels the `hold` dependents of the previous one; a job
    // is cancelled once, so the rounds end with the deepest dependents.
    while !parents.is_empty() {
        let dependents: Vec<Dependent> =
            diesel::sql_query(include_str!("sql/cancel_dependents.sql"))
                .bind::<Array<BigInt>, _>(&parents)
                .bind::<Text, _>(super::NOTIFY_CHANNEL)
                .load(conn)?;
        parents = dependents
            .into_iter()
            .filter(|d| d.status == JobStatus::Cancelled.as_str())
            .map(|d| {
                keys.extend(d.ordering_key);
                d.id
            })
            .collect();
        cancelled.extend(&parents);
    }
    keys.sort_unstable();
    keys.dedup();
    super::ordering_keys::advance_ordering_keys(conn, &keys)?;
    Ok(cancelled)
}

#[derive(QueryableByName)]
struct Dependent {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    status: String,
    #[diesel(sql_type = Nullable<Text>)]
    ordering_key: Option<String>,
}

/// What [`Enqueuer::cancel`] did to the job it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelOutcome {
    /// It was `pending` (or `failed`) and is now `cancelled`, with the
    /// caller's transaction: a rollback leaves it as it was.
    Cancelled,
    /// A worker pool has claimed it (`processing`): its effect may be under way,
    /// so nothing changed. Its worker must find the work pointless itself.
    Claimed,
    /// It had already finished (`done` or `cancelled`): nothing changed.
    Finished(JobStatus),
    /// No job has this id, live or archived.
    NotFound,
}

impl Enqueuer {
    /// Cancels the job `job_id` in whatever transaction `conn` is in (outside
    /// one, in a transaction of its own), as a scheduled job is cancelled
    /// when what it was for happened first: a reminder to renew, say, in the
    /// transaction that records the renewal. It commits or rolls back with
    /// the caller's writes.
    ///
    /// Only a `pending` or `failed` job is cancelled; a claimed or finished
    /// one is left alone, and the [`CancelOutcome`] says which. As with
    /// [`cancel_jobs`], a cancelled job frees the next job of its ordering
    /// key, and its dependents of policy `hold` are cancelled with it.
    pub fn cancel(&self, conn: &mut PgConnection, job_id: i64) -> QueryResult<CancelOutcome> {
        let cancel = |conn: &mut PgConnection| {
            // The status guard of cancel_jobs.sql decides, on the locked
            // row, so a claim that commits first wins; the read after only
            // says why nothing changed.
            if cancel_job_batch(conn, &[job_id])?.contains(&job_id) {
                return Ok(CancelOutcome::Cancelled);
            }
            let status: Option<String> = jobs_all::table
                .filter(jobs_all::id.eq(job_id))
                .select(jobs_all::status)
                .first(conn)
                .optional()?;
            Ok(match status.as_deref().map(str::parse::<JobStatus>) {
                None => CancelOutcome::NotFound,
                Some(Ok(JobStatus::Processing)) => CancelOutcome::Claimed,
                // Claimed when the cancel looked, and handed back or reaped
                // since: cancellable again.
                Some(Ok(JobStatus::Pending | JobStatus::Failed)) => {
                    if cancel_job_batch(conn, &[job_id])?.contains(&job_id) {
                        CancelOutcome::Cancelled
                    } else {
                        CancelOutcome::Claimed
                    }
                }
                Some(Ok(status)) => CancelOutcome::Finished(status),
                Some(Err(e)) => {
                    return Err(diesel::result::Error::DeserializationError(e.into()));
                }
            })
        };
        if super::enqueue::in_transaction(conn) {
            cancel(conn)
        } else {
            conn.transaction(cancel)
        }
    }
}

fn cancellable(status: &str) -> bool {
    status == JobStatus::Pending.as_str() || status == JobStatus::Failed.as_str()
}
