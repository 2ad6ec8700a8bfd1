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
    /// statement that writes such rows (`$1`: a JSON array of them): the
    /// finish then writes every such row of the batch that names one
    /// statement in one round trip, on the worker pool's own connection,
    /// where `apply` would take one per job and a Diesel transaction. `apply`
    /// is not called for a hook that returns one.
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
    /// The kinds of the dependents among them (their last parent ended),
    /// sorted. [`finish_jobs`] woke their worker pools with a NOTIFY at commit;
    /// the worker pool's own finish sends none and wakes them itself.
    pub woken_kinds: Vec<String>,
}

/// What every row of the finishing statement repeats: how many jobs it made
/// claimable, and the kinds of the dependents among them.
pub(crate) type Released = (i64, Vec<String>);

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
    #[diesel(sql_type = Array<Text>)]
    woken_kinds: Vec<String>,
}

/// Records `finishes` in one transaction: one fenced statement for all of them,
/// then the [`CommitHook`]s of the jobs whose outcome it wrote. Error texts
/// are cleaned (control characters out, cut to
/// [`MAX_ERROR_BYTES`](crate::statements::MAX_ERROR_BYTES)), so whatever an
/// executor returns (a mail server's reply, a receiver's body) can always be
/// stored.
pub fn finish_jobs(conn: &mut PgConnection, finishes: &[Finish]) -> QueryResult<FinishReport> {
    finish_jobs_with(conn, finishes, &[])
}

/// [`finish_jobs`], with `writes[i]` committed beside `finishes[i]`'s
/// outcome whatever it is (`JobContext::write_with_outcome`), under the same
/// rule as a done job's [`LocalWrite`]: only if the fenced statement wrote
/// that outcome. `writes` may be shorter than `finishes` (none for the rest).
pub(crate) fn finish_jobs_with(
    conn: &mut PgConnection,
    finishes: &[Finish],
    writes: &[Vec<LocalWrite>],
) -> QueryResult<FinishReport> {
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
    let rows: Vec<HeldRow> = if has_local_writes(finishes, writes) {
        conn.transaction(|conn| {
            let rows: Vec<HeldRow> = update.load(conn)?;
            let applied = applied_claims(rows.iter().map(|r| (r.id, r.lease_token, r.applied)));
            // Rows by statement, in the order the hooks came.
            let mut batched = HookBatches::default();
            for (index, finish) in finishes.iter().enumerate() {
                if !applied.contains(&(finish.job_id, finish.lease_token)) {
                    continue;
                }
                for LocalWrite(hook) in writes_of(finishes, writes, index) {
                    match hook.row() {
                        Some(row) => batched.push(row),
                        None => hook.apply(conn)?,
                    }
                }
            }
            for (statement, rows) in batched.0 {
                diesel::sql_query(statement)
                    .bind::<diesel::sql_types::Jsonb, _>(serde_json::Value::Array(rows))
                    .execute(conn)?;
            }
            QueryResult::Ok(rows)
        })?
    } else {
        update.load(conn)?
    };
    Ok(params.report(rows.into_iter().map(|r| {
        (
            (r.id, r.lease_token),
            r.applied,
            (r.released, r.woken_kinds),
        )
    })))
}

/// The claims whose outcome the finishing statement wrote, from its rows
/// `(id, lease_token, applied)`.
pub(crate) fn applied_claims(
    rows: impl IntoIterator<Item = (i64, i64, bool)>,
) -> HashSet<(i64, i64)> {
    rows.into_iter()
        .filter(|(_, _, applied)| *applied)
        .map(|(id, token, _)| (id, token))
        .collect()
}

/// The writes that commit with `finishes[index]`'s outcome: a done job's
/// [`LocalWrite`], then those attached to the attempt whatever its outcome.
pub(crate) fn writes_of<'a>(
    finishes: &'a [Finish],
    writes: &'a [Vec<LocalWrite>],
    index: usize,
) -> impl Iterator<Item = &'a LocalWrite> {
    let done = match &finishes[index].outcome {
        Outcome::Done { local } => local.as_ref(),
        _ => None,
    };
    done.into_iter()
        .chain(writes.get(index).into_iter().flatten())
}

/// Whether two statements are one: by address first, since every row of a
/// kind names the same `&'static str`, and comparing its text per row would
/// read the whole statement each time.
pub(crate) fn same_text(a: &str, b: &str) -> bool {
    std::ptr::eq(a, b) || a == b
}

/// Hook rows grouped by the statement that writes them, in the order the
/// statements first came: one round trip per statement for a whole batch.
#[derive(Debug, Default)]
pub(crate) struct HookBatches(pub(crate) Vec<(&'static str, Vec<serde_json::Value>)>);

impl HookBatches {
    pub(crate) fn push(&mut self, HookRow { statement, row }: HookRow) {
        match self.0.iter_mut().find(|(s, _)| same_text(s, statement)) {
            Some((_, rows)) => rows.push(row),
            None => self.0.push((statement, vec![row])),
        }
    }
}

/// The finishing statement (`sql/finish_jobs.sql`), for Diesel and for the
/// worker pool's prepared statement alike.
pub(crate) const FINISH_SQL: &str = include_str!("sql/finish_jobs.sql");

/// Whether any of `finishes` carries a [`CommitHook`], or `writes` has any:
/// those need a transaction around the finish.
pub(crate) fn has_local_writes(finishes: &[Finish], writes: &[Vec<LocalWrite>]) -> bool {
    writes.iter().any(|w| !w.is_empty())
        || finishes
            .iter()
            .any(|f| matches!(f.outcome, Outcome::Done { local: Some(_) }))
}

/// The row of every write that commits with `finishes` (see [`writes_of`]),
/// each with its finish's index; `None` when some write has no row and must
/// run its [`CommitHook::apply`] on a Diesel connection.
pub(crate) fn hook_rows(
    finishes: &[Finish],
    writes: &[Vec<LocalWrite>],
) -> Option<Vec<(usize, HookRow)>> {
    let mut rows = Vec::new();
    for index in 0..finishes.len() {
        for LocalWrite(hook) in writes_of(finishes, writes, index) {
            rows.push((index, hook.row()?));
        }
    }
    Some(rows)
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
        rows: impl IntoIterator<Item = ((i64, i64), bool, Released)>,
    ) -> FinishReport {
        let mut released = (0, Vec::new());
        let held: HashMap<(i64, i64), bool> = rows
            .into_iter()
            .map(|(id, applied, count)| {
                // Every row carries the same released jobs.
                released = count;
                (id, applied)
            })
            .collect();
        let mut report = FinishReport {
            released: usize::try_from(released.0).unwrap_or(0),
            woken_kinds: released.1,
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
