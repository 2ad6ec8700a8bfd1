//! Dependencies between jobs: a job enqueued with parents stays `pending`
//! and unclaimable until they are `done` (see [`JobOptions::depends_on`]).
//!
//! The enqueue resolves the parents before it writes anything: which exist,
//! which are still unfinished (locked until the enqueuing transaction ends,
//! so none ends unseen), and which refuse a dependent. The finishing
//! statement releases the dependents (`sql/finish_jobs.sql`).

use std::collections::HashMap;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Text};

use super::{JobOptions, JobStatus, NewJob};

/// What a dependent does when a parent does not finish `done`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum DependencyPolicy {
    /// A `failed` parent holds the dependent until an operator retries the
    /// parent (and it succeeds), as a failed head holds its ordering key; a
    /// `cancelled` parent cancels the dependent (and its own `hold`
    /// dependents), `last_error` naming the parent.
    #[default]
    Hold,
    /// The dependent runs once every parent has ended, however it ended;
    /// [`JobContext::unfinished_parents`](crate::worker::JobContext::unfinished_parents)
    /// tells its worker which did not finish `done`.
    Run,
}

impl DependencyPolicy {
    /// The name stored in `jobs.dependency_policy`.
    pub fn as_str(self) -> &'static str {
        match self {
            DependencyPolicy::Hold => "hold",
            DependencyPolicy::Run => "run",
        }
    }
}

/// A job's parent: a job enqueued before (in this transaction or an earlier
/// one), or another job of the same [`Enqueuer::enqueue_many`](super::Enqueuer::enqueue_many)
/// call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Parent {
    /// The job with this id.
    Job(i64),
    /// The job at this index of the same `enqueue_many` call.
    InBatch(usize),
}

impl Parent {
    /// The id of a parent enqueued before this call.
    fn earlier(self) -> Option<i64> {
        match self {
            Parent::Job(id) => Some(id),
            Parent::InBatch(_) => None,
        }
    }

    /// The index of a parent in the same call.
    fn in_batch(self) -> Option<usize> {
        match self {
            Parent::InBatch(index) => Some(index),
            Parent::Job(_) => None,
        }
    }
}

impl From<i64> for Parent {
    fn from(id: i64) -> Self {
        Parent::Job(id)
    }
}

/// Why an enqueue with parents was refused. Nothing was written; the enqueue
/// returns it as [`diesel::result::Error::QueryBuilderError`], so `?` rolls
/// the caller's transaction back ([`DependencyError::of`] finds it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DependencyError {
    /// No job has this id, in `jobs` or the archive.
    #[error("parent job {0} does not exist")]
    MissingParent(i64),
    /// The parent was cancelled: its dependent could never run.
    #[error("parent job {0} is cancelled")]
    CancelledParent(i64),
    /// [`Parent::InBatch`] names an index past the end of the call's jobs.
    #[error("job {job} of the batch names parent {parent}, past the batch's {len} jobs")]
    NoSuchBatchJob {
        /// The dependent's index.
        job: usize,
        /// The index it names.
        parent: usize,
        /// How many jobs the call has.
        len: usize,
    },
    /// The jobs of the call at these indexes wait for each other in a cycle
    /// (a job naming itself included): none could ever run.
    #[error("jobs {0:?} of the batch depend on each other in a cycle")]
    Cycle(Vec<usize>),
}

impl DependencyError {
    /// The dependency error inside an enqueue's error, if that is what it is.
    pub fn of(error: &diesel::result::Error) -> Option<&DependencyError> {
        match error {
            diesel::result::Error::QueryBuilderError(inner) => inner.downcast_ref(),
            _ => None,
        }
    }

    fn into_diesel(self) -> diesel::result::Error {
        diesel::result::Error::QueryBuilderError(Box::new(self))
    }
}

/// A dependent held by a failed parent (`jobs blocked`): it stays `pending`
/// until an operator retries the parent (and it succeeds) or cancels it.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName, serde::Serialize)]
pub struct HeldDependent {
    /// The dependent job.
    #[diesel(sql_type = BigInt, column_name = id)]
    pub job_id: i64,
    /// The dependent's kind.
    #[diesel(sql_type = Text)]
    pub kind: String,
    /// Its policy (`hold`: only such dependents stay behind a failed parent).
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    pub dependency_policy: Option<String>,
    /// The failed parent holding it.
    #[diesel(sql_type = BigInt)]
    pub parent_id: i64,
    /// The parent's kind.
    #[diesel(sql_type = Text)]
    pub parent_kind: String,
    /// The parent's status (`failed`).
    #[diesel(sql_type = Text)]
    pub parent_status: String,
    /// Why the parent failed.
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    pub parent_error: Option<String>,
    /// When the parent failed.
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Timestamptz>)]
    pub parent_finished_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Up to `limit` dependents held by a failed parent, one row per dependent
/// and failed parent, oldest parent first. See `sql/held_dependents.sql`.
pub fn held_dependents(conn: &mut PgConnection, limit: i64) -> QueryResult<Vec<HeldDependent>> {
    diesel::sql_query(include_str!("sql/held_dependents.sql"))
        .bind::<BigInt, _>(limit)
        .load(conn)
}

/// The dependency columns of one job, as the enqueue decided them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Resolved {
    pub(super) depends_on: Option<Vec<i64>>,
    pub(super) waiting_on: Vec<i64>,
    pub(super) policy: Option<&'static str>,
    pub(super) unfinished_parents: Option<Vec<i64>>,
}

impl JobOptions {
    /// The job waits for `parents` (ids of jobs enqueued before, or
    /// [`Parent::InBatch`]): it stays `pending` and unclaimable until every
    /// one is `done`, with policy [`DependencyPolicy::Hold`] unless
    /// [`JobOptions::dependency_policy`] says otherwise. A parent that does
    /// not exist or is already `cancelled`, or a cycle, makes the enqueue an
    /// error ([`DependencyError`]) and writes nothing. The enqueue locks the
    /// unfinished parents (`FOR KEY SHARE`) until its transaction ends.
    pub fn depends_on<P: Into<Parent>>(mut self, parents: impl IntoIterator<Item = P>) -> Self {
        self.depends_on = parents.into_iter().map(Into::into).collect();
        self
    }
    /// Sets [`JobOptions::dependency_policy`]: what a parent that does not
    /// finish `done` does to the job.
    pub fn dependency_policy(mut self, policy: DependencyPolicy) -> Self {
        self.dependency_policy = policy;
        self
    }
}

/// Checks the in-batch parents of `jobs` for indexes out of range and
/// cycles.
fn check_batch(jobs: &[NewJob]) -> Result<(), DependencyError> {
    let len = jobs.len();
    // Kahn's algorithm over the in-batch edges: what never reaches zero
    // remaining parents is on a cycle or behind one.
    let mut remaining = vec![0usize; len];
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); len];
    for (job, new_job) in jobs.iter().enumerate() {
        for parent in &new_job.parents {
            if let Parent::InBatch(parent) = *parent {
                if parent >= len {
                    return Err(DependencyError::NoSuchBatchJob { job, parent, len });
                }
                remaining[job] += 1;
                children[parent].push(job);
            }
        }
    }
    let mut ready: Vec<usize> = (0..len).filter(|&i| remaining[i] == 0).collect();
    while let Some(job) = ready.pop() {
        for &child in &children[job] {
            remaining[child] -= 1;
            if remaining[child] == 0 {
                ready.push(child);
            }
        }
    }
    let stuck: Vec<usize> = (0..len).filter(|&i| remaining[i] > 0).collect();
    if stuck.is_empty() {
        Ok(())
    } else {
        Err(DependencyError::Cycle(stuck))
    }
}

#[derive(QueryableByName)]
struct ParentRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    status: String,
}

/// The status of each of `ids`, the unfinished ones locked until the
/// transaction ends. See `sql/lock_dependency_parents.sql`.
fn parent_statuses(conn: &mut PgConnection, ids: &[i64]) -> QueryResult<HashMap<i64, String>> {
    let mut found: HashMap<i64, String> =
        diesel::sql_query(include_str!("sql/lock_dependency_parents.sql"))
            .bind::<Array<BigInt>, _>(ids)
            .load::<ParentRow>(conn)?
            .into_iter()
            .map(|r| (r.id, r.status))
            .collect();
    let missing: Vec<i64> = ids
        .iter()
        .copied()
        .filter(|id| !found.contains_key(id))
        .collect();
    if !missing.is_empty() {
        // A parent that moved to the archive after the first statement's
        // snapshot was skipped by its lock and not yet in the archive there.
        use crate::schema::jobs_all;
        let late: Vec<(i64, String)> = jobs_all::table
            .filter(jobs_all::id.eq_any(&missing))
            .select((jobs_all::id, jobs_all::status))
            .load(conn)?;
        found.extend(late);
    }
    Ok(found)
}

/// Resolves the parents of `jobs` (in the caller's transaction): an error
/// when one is refused, else each job's dependency columns, and whether any
/// job names another of the batch (then the rows need their ids before the
/// insert).
pub(super) fn resolve(
    conn: &mut PgConnection,
    jobs: &[NewJob],
) -> QueryResult<Option<(Vec<Resolved>, bool)>> {
    if jobs.iter().all(|j| j.parents.is_empty()) {
        return Ok(None);
    }
    check_batch(jobs).map_err(DependencyError::into_diesel)?;
    let mut ids: Vec<i64> = jobs
        .iter()
        .flat_map(|j| j.parents.iter())
        .filter_map(|p| p.earlier())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let statuses = if ids.is_empty() {
        HashMap::new()
    } else {
        parent_statuses(conn, &ids)?
    };
    for id in &ids {
        match statuses.get(id).map(String::as_str) {
            None => return Err(DependencyError::MissingParent(*id).into_diesel()),
            Some(s) if s == JobStatus::Cancelled.as_str() => {
                return Err(DependencyError::CancelledParent(*id).into_diesel());
            }
            Some(_) => {}
        }
    }
    let in_batch = jobs
        .iter()
        .any(|j| j.parents.iter().any(|p| matches!(p, Parent::InBatch(_))));
    let resolved = jobs.iter().map(|job| resolve_one(job, &statuses)).collect();
    Ok(Some((resolved, in_batch)))
}

/// One job's columns; in-batch parents are written as `-1 - index` until the
/// ids are known ([`assign_batch_ids`]).
fn resolve_one(job: &NewJob, statuses: &HashMap<i64, String>) -> Resolved {
    if job.parents.is_empty() {
        return Resolved::default();
    }
    let policy = job.policy;
    let mut depends_on = Vec::with_capacity(job.parents.len());
    let mut waiting_on = Vec::new();
    let mut unfinished = Vec::new();
    for parent in &job.parents {
        let id = match parent {
            Parent::Job(id) => *id,
            Parent::InBatch(index) => batch_placeholder(*index),
        };
        if depends_on.contains(&id) {
            continue;
        }
        depends_on.push(id);
        match parent {
            Parent::InBatch(_) => waiting_on.push(id),
            Parent::Job(id) => match statuses.get(id).map(String::as_str) {
                Some("done") => {}
                Some("failed") if policy == DependencyPolicy::Run => unfinished.push(*id),
                _ => waiting_on.push(*id),
            },
        }
    }
    Resolved {
        depends_on: Some(depends_on),
        waiting_on,
        policy: Some(policy.as_str()),
        unfinished_parents: (!unfinished.is_empty()).then_some(unfinished),
    }
}

fn batch_placeholder(index: usize) -> i64 {
    -1 - i64::try_from(index).unwrap_or(i64::MAX - 1)
}

/// Draws ids for every job of a batch whose jobs name each other, in order
/// (the enqueue order is the id order), and puts them in place of the
/// placeholders.
pub(super) fn assign_batch_ids(conn: &mut PgConnection, jobs: &mut [NewJob]) -> QueryResult<()> {
    #[derive(QueryableByName)]
    struct IdRow {
        #[diesel(sql_type = BigInt)]
        id: i64,
    }
    let count = i64::try_from(jobs.len()).unwrap_or(i64::MAX);
    let ids: Vec<i64> = diesel::sql_query(
        "SELECT nextval(pg_get_serial_sequence('jobs', 'id')) AS id \
         FROM generate_series(1, $1) ORDER BY 1",
    )
    .bind::<BigInt, _>(count)
    .load::<IdRow>(conn)?
    .into_iter()
    .map(|r| r.id)
    .collect();
    let real = |id: i64| -> i64 {
        if id < 0 {
            usize::try_from(-1 - id)
                .ok()
                .and_then(|i| ids.get(i).copied())
                .unwrap_or(id)
        } else {
            id
        }
    };
    // The parents within the batch: the finish looks for dependents only of
    // jobs not known to have none (finish_jobs.sql).
    let parents: Vec<usize> = jobs
        .iter()
        .flat_map(|job| job.parents.iter())
        .filter_map(|parent| parent.in_batch())
        .collect();
    for index in parents {
        if let Some(parent) = jobs.get_mut(index) {
            parent.has_dependents = true;
        }
    }
    for (job, id) in jobs.iter_mut().zip(&ids) {
        job.id = Some(*id);
        job.waiting_on = job.waiting_on.iter().map(|&p| real(p)).collect();
        if let Some(depends_on) = &mut job.depends_on {
            for p in depends_on.iter_mut() {
                *p = real(*p);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(parents: &[Parent]) -> NewJob {
        let options = JobOptions::default().depends_on(parents.iter().copied());
        let mut job = NewJob::new("k", serde_json::json!({}));
        job.parents = options.depends_on;
        job
    }

    #[test]
    fn batch_cycles_and_bad_indexes_are_refused_and_chains_are_not() {
        let chain = [
            job(&[]),
            job(&[Parent::InBatch(0)]),
            job(&[Parent::InBatch(1)]),
        ];
        assert_eq!(check_batch(&chain), Ok(()));
        let forward = [job(&[Parent::InBatch(1)]), job(&[])];
        assert_eq!(check_batch(&forward), Ok(()));
        let own = [job(&[Parent::InBatch(0)])];
        assert_eq!(check_batch(&own), Err(DependencyError::Cycle(vec![0])));
        let pair = [
            job(&[]),
            job(&[Parent::InBatch(2)]),
            job(&[Parent::InBatch(1)]),
            job(&[Parent::InBatch(2)]),
        ];
        assert_eq!(
            check_batch(&pair),
            Err(DependencyError::Cycle(vec![1, 2, 3]))
        );
        let past = [job(&[Parent::InBatch(5)])];
        assert_eq!(
            check_batch(&past),
            Err(DependencyError::NoSuchBatchJob {
                job: 0,
                parent: 5,
                len: 1
            })
        );
    }

    #[test]
    fn a_failed_parent_holds_a_hold_dependent_and_is_noted_for_a_run_one() {
        let statuses: HashMap<i64, String> = [(1, "done"), (2, "failed"), (3, "processing")]
            .into_iter()
            .map(|(id, s)| (id, s.to_owned()))
            .collect();
        let mut hold = job(&[
            Parent::Job(1),
            Parent::Job(2),
            Parent::Job(3),
            Parent::Job(3),
        ]);
        let resolved = resolve_one(&hold, &statuses);
        assert_eq!(resolved.waiting_on, vec![2, 3]);
        assert_eq!(resolved.depends_on, Some(vec![1, 2, 3]));
        assert_eq!(resolved.unfinished_parents, None);
        hold.policy = DependencyPolicy::Run;
        let resolved = resolve_one(&hold, &statuses);
        assert_eq!(resolved.waiting_on, vec![3]);
        assert_eq!(resolved.unfinished_parents, Some(vec![2]));
        assert_eq!(resolved.policy, Some("run"));
    }
}
