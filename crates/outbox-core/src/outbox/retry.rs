//! Putting failed jobs back in the queue (`jobs retry`).

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use serde::Serialize;

use super::JobStatus;
use crate::schema::{jobs, jobs_all};

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
    /// These jobs, all or nothing: if any is not `failed` (or does not
    /// exist), none is retried and the report refuses it. Duplicates count
    /// once.
    Ids(Vec<i64>),
    /// Every job that is `failed` when the statement runs (nothing is
    /// refused; jobs in other statuses are left alone).
    AllFailed {
        /// Only jobs of this kind; `None`: every kind.
        kind: Option<String>,
    },
}

/// A job named to `retry_failed_jobs` that cannot be retried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RetryRefusal {
    /// The job named.
    pub id: i64,
    /// Its current status, which is not `failed` (a `done` job is found in
    /// the archive); `None` when no such job exists.
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
