//! Recording outcomes: done, retry, failed, all fenced, many per statement.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Nullable, Text};

use super::claim::millis;
use super::text::clean_error;

/// A write that must commit together with the job's completion, and only then:
/// this is what makes a local effect (a rendered document stored in the application's database) happen
/// exactly once. An effect returns one with its success; [`finish_jobs`] runs it
/// in the transaction that records the completion, after the fenced write
/// matched, so a zombie's late success writes nothing.
pub trait CommitHook: Send + Sync + 'static {
    /// Runs inside the completing transaction. An error rolls back every
    /// outcome of the batch with it, so keep it to writes that cannot conflict
    /// (an `ON CONFLICT DO NOTHING` insert, say).
    fn apply(&self, conn: &mut PgConnection) -> QueryResult<()>;
    /// One line for logs: what the hook writes.
    fn describe(&self) -> String;
    /// A hook that writes one row may hand it over instead, as JSON with the
    /// statement that writes such rows (`$1`: a JSON array of them, read with
    /// `jsonb_to_recordset`): the finish then writes every such row of the
    /// batch that names one statement in one round trip, where `apply` would
    /// take one per job. `apply` is not called for a hook that returns one.
    fn row(&self) -> Option<HookRow> {
        None
    }
}

/// One row of a [`CommitHook::row`]: the statement that inserts a batch of
/// such rows, and this hook's.
#[derive(Debug, Clone)]
pub struct HookRow {
    /// Inserts the rows of `$1`, a JSON array; the same text for every hook
    /// whose rows it writes.
    pub statement: &'static str,
    /// This hook's row, a JSON object.
    pub row: serde_json::Value,
}

/// A [`CommitHook`] as an effect hands it over: cheap to clone, compared by identity.
#[derive(Clone)]
pub struct LocalWrite(Arc<dyn CommitHook>);

impl LocalWrite {
    /// Wraps `hook`. Two `LocalWrite`s are equal only when one is a clone of
    /// the other (the same hook), never by what the hooks would write.
    pub fn new(hook: impl CommitHook) -> Self {
        LocalWrite(Arc::new(hook))
    }
}

impl std::fmt::Debug for LocalWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("LocalWrite")
            .field(&self.0.describe())
            .finish()
    }
}

impl PartialEq for LocalWrite {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for LocalWrite {}

/// What happened to one attempt, and so the job's next status.
/// The worker pool derives it from a worker's result and the job's attempts left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The effect succeeded: the job ends `done`, leaves `jobs` for the
    /// `jobs_done` archive, and releases the next job of its ordering key
    /// and the dependents that waited for it alone.
    /// `last_error` keeps the text of any earlier failed attempt.
    Done {
        /// A write to commit in the same transaction as the completion, and
        /// only if the completion is written (see [`CommitHook`]).
        local: Option<LocalWrite>,
    },
    /// Back to `pending`, due after `delay`.
    Retry {
        /// From the database's `now()` when the outcome is written, to the
        /// millisecond: the new `run_after`.
        delay: Duration,
        /// Stored as `last_error`, cleaned of control characters and cut
        /// to [`MAX_ERROR_BYTES`](crate::statements::MAX_ERROR_BYTES).
        error: String,
    },
    /// The job ends `failed`: it stays in `jobs`, holds its ordering key, and
    /// waits for an operator to retry or cancel it.
    Failed {
        /// Stored as `last_error`, cleaned as [`Outcome::Retry`]'s is.
        error: String,
    },
}

impl Outcome {
    fn status(&self) -> &'static str {
        match self {
            Outcome::Done { .. } => "done",
            Outcome::Retry { .. } => "pending",
            Outcome::Failed { .. } => "failed",
        }
    }
}

/// One claim's outcome, with the fencing token the claim drew.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finish {
    /// The claimed job ([`ClaimedJob::id`](crate::statements::ClaimedJob::id)).
    pub job_id: i64,
    /// The claim's fencing token
    /// ([`ClaimedJob::lease_token`](crate::statements::ClaimedJob::lease_token)): the
    /// outcome is written only while the job is still `processing` under it.
    pub lease_token: i64,
    /// What to record.
    pub outcome: Outcome,
}

/// What [`finish_jobs`] did with each [`Finish`]: every job id of the call is
/// in exactly one of `applied`, `busy` and `lost`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FinishReport {
    /// Jobs whose outcome was recorded.
    pub applied: Vec<i64>,
    /// Jobs still held by these claims whose row another transaction had
    /// locked: nothing was written for them; write them again shortly.
    pub busy: Vec<i64>,
    /// Jobs these claims no longer hold (lease reaped and the job re-claimed,
    /// cancelled by an operator): nothing changed.
    pub lost: Vec<i64>,
    /// Jobs made claimable: the job before them in their ordering key is
    /// now done, or the last parent they waited for has ended.
    pub released: usize,
}

#[derive(QueryableByName)]
struct HeldRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = BigInt)]
    lease_token: i64,
    #[diesel(sql_type = Bool)]
    applied: bool,
    #[diesel(sql_type = BigInt)]
    released: i64,
}

/// Records `finishes` in one transaction: one fenced statement for all of them,
/// then the [`CommitHook`]s of the jobs whose outcome it wrote. Error texts
/// are cleaned (control characters out, cut to
/// [`MAX_ERROR_BYTES`](crate::statements::MAX_ERROR_BYTES)), so whatever an
/// executor returns (a mail server's reply, a receiver's body) can always be
/// stored.
pub fn finish_jobs(conn: &mut PgConnection, finishes: &[Finish]) -> QueryResult<FinishReport> {
    if finishes.is_empty() {
        return Ok(FinishReport::default());
    }
    let params = FinishParams::new(finishes);
    let update = diesel::sql_query(FINISH_SQL)
        .bind::<Array<BigInt>, _>(&params.ids)
        .bind::<Array<BigInt>, _>(&params.tokens)
        .bind::<Array<Text>, _>(&params.statuses)
        .bind::<Array<BigInt>, _>(&params.delays)
        .bind::<Array<Nullable<Text>>, _>(&params.errors)
        .bind::<Text, _>(super::NOTIFY_CHANNEL);
    // Without local writes the UPDATE is atomic on its own; a transaction
    // would only add BEGIN and COMMIT round trips to the hot path.
    let rows: Vec<HeldRow> = if has_local_writes(finishes) {
        conn.transaction(|conn| {
            let rows: Vec<HeldRow> = update.load(conn)?;
            let applied: HashSet<(i64, i64)> = rows
                .iter()
                .filter(|r| r.applied)
                .map(|r| (r.id, r.lease_token))
                .collect();
            // Rows by statement, in the order the hooks came.
            let mut batched: Vec<(&'static str, Vec<serde_json::Value>)> = Vec::new();
            for finish in finishes
                .iter()
                .filter(|f| applied.contains(&(f.job_id, f.lease_token)))
            {
                if let Outcome::Done {
                    local: Some(LocalWrite(hook)),
                } = &finish.outcome
                {
                    match hook.row() {
                        Some(HookRow { statement, row }) => {
                            match batched.iter_mut().find(|(s, _)| *s == statement) {
                                Some((_, rows)) => rows.push(row),
                                None => batched.push((statement, vec![row])),
                            }
                        }
                        None => hook.apply(conn)?,
                    }
                }
            }
            for (statement, rows) in batched {
                diesel::sql_query(statement)
                    .bind::<diesel::sql_types::Jsonb, _>(serde_json::Value::Array(rows))
                    .execute(conn)?;
            }
            QueryResult::Ok(rows)
        })?
    } else {
        update.load(conn)?
    };
    Ok(params.report(
        rows.into_iter()
            .map(|r| ((r.id, r.lease_token), r.applied, r.released)),
    ))
}

/// The finishing statement (`sql/finish_jobs.sql`), for Diesel and for the
/// worker pool's prepared statement alike.
pub(crate) const FINISH_SQL: &str = include_str!("sql/finish_jobs.sql");

/// Whether any of `finishes` carries a [`CommitHook`]: those need the
/// transaction (and the Diesel connection) the hook writes in.
pub(crate) fn has_local_writes(finishes: &[Finish]) -> bool {
    finishes
        .iter()
        .any(|f| matches!(f.outcome, Outcome::Done { local: Some(_) }))
}

/// The finishing statement's parameters, one array each, in the finishes'
/// order. Error texts are cleaned here (control characters out, cut to
/// [`MAX_ERROR_BYTES`](crate::statements::MAX_ERROR_BYTES)), so whatever an
/// executor returns (a mail server's reply, a receiver's body) can always be
/// stored.
pub(crate) struct FinishParams {
    pub(crate) ids: Vec<i64>,
    pub(crate) tokens: Vec<i64>,
    pub(crate) statuses: Vec<&'static str>,
    pub(crate) delays: Vec<i64>,
    pub(crate) errors: Vec<Option<String>>,
}

impl FinishParams {
    pub(crate) fn new(finishes: &[Finish]) -> Self {
        let mut params = FinishParams {
            ids: Vec::with_capacity(finishes.len()),
            tokens: Vec::with_capacity(finishes.len()),
            statuses: Vec::with_capacity(finishes.len()),
            delays: Vec::with_capacity(finishes.len()),
            errors: Vec::with_capacity(finishes.len()),
        };
        for finish in finishes {
            params.ids.push(finish.job_id);
            params.tokens.push(finish.lease_token);
            params.statuses.push(finish.outcome.status());
            let (delay, error) = match &finish.outcome {
                Outcome::Done { .. } => (0, None),
                Outcome::Retry { delay, error } => (millis(*delay), Some(clean_error(error))),
                Outcome::Failed { error } => (0, Some(clean_error(error))),
            };
            params.delays.push(delay);
            params.errors.push(error);
        }
        params
    }

    /// The report from the statement's rows `(id, applied, released)`.
    /// Keyed by `(id, token)`: two claims of one job in one call (a stale one
    /// beside the current one) get their own answers.
    pub(crate) fn report(
        self,
        rows: impl IntoIterator<Item = ((i64, i64), bool, i64)>,
    ) -> FinishReport {
        let mut released = 0;
        let held: HashMap<(i64, i64), bool> = rows
            .into_iter()
            .map(|(id, applied, count)| {
                // Every row carries the same count of released jobs.
                released = count;
                (id, applied)
            })
            .collect();
        let mut report = FinishReport {
            released: usize::try_from(released).unwrap_or(0),
            ..FinishReport::default()
        };
        for (id, token) in self.ids.into_iter().zip(self.tokens) {
            match held.get(&(id, token)) {
                Some(true) => report.applied.push(id),
                Some(false) => report.busy.push(id),
                None => report.lost.push(id),
            }
        }
        report
    }
}
