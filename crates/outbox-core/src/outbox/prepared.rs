//! The worker pool's hot statements (claim, finish, heartbeat, release) and its
//! reaper's (reap, the stranded-key sweep) as prepared statements on a
//! tokio-postgres connection.
//!
//! The SQL is the same text Diesel runs (`sql/*.sql`). Diesel sends a
//! `sql_query` unprepared: there each claim and finish is parsed and planned
//! afresh, in two round trips (prepare an unnamed statement, then run it).
//! Prepared once per connection, each runs in one round trip, with a plan the
//! server may keep, and many may be in flight on one connection at once
//! (tokio-postgres pipelines them).
//!
//! Outcomes with local writes ([`CommitHook`](crate::outbox::CommitHook))
//! that hand over their rows ([`HookRow`]) stay here too: the finish and
//! each statement of those rows run in one transaction, pipelined
//! ([`HotStatements::finish_with_rows`]). A hook without a row writes
//! through a Diesel connection, so its batch goes there.

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Statement};

use super::NOTIFY_CHANNEL;
use super::claim::{CLAIM_SQL, ClaimPosition, ClaimRequest, ClaimedJob, millis};
use super::finish::{
    FINISH_SQL, Finish, FinishParams, FinishReport, HookBatches, HookRow, Released, applied_claims,
    has_local_writes, same_text,
};
use super::lease::{EXTEND_SQL, HAND_BACK_SQL, HeartbeatReport, JobLease, heartbeat_report, split};
use super::ordering_keys::{ADVANCE_KEYS_SQL, STRANDED_KEYS_SQL};
use super::reap::{
    ExpiredRow, ReapPlan, ReapReport, ReapRequest, SELECT_EXPIRED_SQL, UPDATE_REAPED_SQL,
};
use super::standalone::FINISH_STANDALONE_SQL;
use crate::db::query_expecting;

/// The claim's parameter types, in [`CLAIM_SQL`]'s order: limit, kinds,
/// worker id, lease in milliseconds, the cursor's `run_after` and id. For a
/// benchmark preparing the claim on a connection of its own.
pub const CLAIM_PARAMS: &[Type] = &[
    Type::INT8,
    Type::TEXT_ARRAY,
    Type::TEXT,
    Type::INT8,
    Type::TIMESTAMPTZ,
    Type::INT8,
];

/// The parameters of the statements that write one row per outcome (the
/// finish, the reaped jobs' update): ids, lease tokens, statuses, delays in
/// milliseconds, errors, and the channel that wakes worker pools for a released
/// dependent.
const OUTCOME_PARAMS: &[Type] = &[
    Type::INT8_ARRAY,
    Type::INT8_ARRAY,
    Type::TEXT_ARRAY,
    Type::INT8_ARRAY,
    Type::TEXT_ARRAY,
    Type::TEXT,
];

/// The files of the statements [`HotStatements`] prepares (in `src/outbox/sql/`),
/// each with its text: what [`HotStatements::prepare_rewritten`] hands its
/// rewrite.
pub const HOT_STATEMENT_FILES: [(&str, &str); 9] = [
    ("claim_jobs.sql", CLAIM_SQL),
    ("finish_jobs.sql", FINISH_SQL),
    ("finish_standalone_jobs.sql", FINISH_STANDALONE_SQL),
    ("extend_leases.sql", EXTEND_SQL),
    ("hand_back_jobs.sql", HAND_BACK_SQL),
    ("select_expired_leases.sql", SELECT_EXPIRED_SQL),
    ("update_reaped_jobs.sql", UPDATE_REAPED_SQL),
    ("stranded_ordering_keys.sql", STRANDED_KEYS_SQL),
    ("advance_ordering_keys.sql", ADVANCE_KEYS_SQL),
];

/// The worker pool's statements, prepared on one connection (and usable only
/// there): what a worker pool runs, for a test that drives jobs through the very
/// calls the worker pool makes.
#[derive(Debug, Clone)]
pub struct HotStatements {
    claim: Statement,
    finish: Statement,
    /// `sql/finish_standalone_jobs.sql` (see `standalone.rs`).
    pub(super) finish_standalone: Statement,
    extend: Statement,
    hand_back: Statement,
    select_expired: Statement,
    update_reaped: Statement,
    stranded_keys: Statement,
    advance_keys: Statement,
}

impl HotStatements {
    /// Prepares them all, pipelined: one round trip's wait in all. The
    /// parameter types are Diesel's binds, so the server infers nothing (it
    /// would take the lease's `$4 * interval` for a float).
    pub async fn prepare(client: &Client) -> Result<Self, tokio_postgres::Error> {
        Self::prepare_rewritten(client, |_, text| text.to_owned()).await
    }

    /// [`HotStatements::prepare`], each statement's text first passed through
    /// `rewrite(file, text)` ([`HOT_STATEMENT_FILES`]): how a test breaks one
    /// rule of the protocol on purpose and checks that its model notices,
    /// while the files stay the one source of the SQL.
    pub async fn prepare_rewritten(
        client: &Client,
        rewrite: impl Fn(&'static str, &'static str) -> String,
    ) -> Result<Self, tokio_postgres::Error> {
        let [
            claim_sql,
            finish_sql,
            finish_standalone_sql,
            extend_sql,
            hand_back_sql,
            select_expired_sql,
            update_reaped_sql,
            stranded_keys_sql,
            advance_keys_sql,
        ] = HOT_STATEMENT_FILES.map(|(file, text)| rewrite(file, text));
        let (
            claim,
            finish,
            finish_standalone,
            extend,
            hand_back,
            select_expired,
            update_reaped,
            stranded_keys,
            advance_keys,
        ) = tokio::try_join!(
            client.prepare_typed(&claim_sql, CLAIM_PARAMS),
            client.prepare_typed(&finish_sql, OUTCOME_PARAMS),
            client.prepare_typed(
                &finish_standalone_sql,
                &[Type::INT8_ARRAY, Type::INT8_ARRAY]
            ),
            client.prepare_typed(
                &extend_sql,
                &[Type::INT8_ARRAY, Type::INT8_ARRAY, Type::INT8]
            ),
            client.prepare_typed(&hand_back_sql, &[Type::INT8_ARRAY, Type::INT8_ARRAY]),
            client.prepare_typed(
                &select_expired_sql,
                &[Type::INT8, Type::INT8, Type::INT8_ARRAY]
            ),
            client.prepare_typed(&update_reaped_sql, OUTCOME_PARAMS),
            client.prepare_typed(&stranded_keys_sql, &[Type::INT8]),
            client.prepare_typed(&advance_keys_sql, &[Type::TEXT_ARRAY]),
        )?;
        Ok(HotStatements {
            claim,
            finish,
            finish_standalone,
            extend,
            hand_back,
            select_expired,
            update_reaped,
            stranded_keys,
            advance_keys,
        })
    }

    /// [`claim_jobs`](crate::statements::claim_jobs), or
    /// [`claim_jobs_after`](crate::statements::claim_jobs_after) with `after`.
    pub async fn claim(
        &self,
        client: &Client,
        request: &ClaimRequest<'_>,
        after: Option<ClaimPosition>,
    ) -> Result<Vec<ClaimedJob>, tokio_postgres::Error> {
        if request.limit <= 0 || request.kinds.is_empty() {
            return Ok(Vec::new());
        }
        let run_after: Option<DateTime<Utc>> = after.map(|a| a.run_after);
        let expected = usize::try_from(request.limit).unwrap_or(0);
        let rows = query_expecting(
            client,
            &self.claim,
            &[
                &request.limit,
                &request.kinds,
                &request.worker_id,
                &millis(request.lease),
                &run_after,
                &after.map_or(0, |a| a.id),
            ],
            expected,
        )
        .await?;
        // A loop, not `collect`: a collect of `Result`s cannot size its vector.
        let mut jobs = Vec::with_capacity(rows.len());
        for row in &rows {
            jobs.push(ClaimedJob::from_row(row)?);
        }
        Ok(jobs)
    }

    /// [`finish_jobs`](crate::statements::finish_jobs) for outcomes without a
    /// local write (those need Diesel's transaction: see the module docs).
    pub async fn finish(
        &self,
        client: &Client,
        finishes: &[Finish],
    ) -> Result<FinishReport, tokio_postgres::Error> {
        debug_assert!(
            !has_local_writes(finishes, &[]),
            "local writes go through finish_with_rows"
        );
        if finishes.is_empty() {
            return Ok(FinishReport::default());
        }
        let params = FinishParams::new(finishes);
        let rows = self.run_finish(client, &params).await?;
        Ok(params.report(rows))
    }

    /// [`HotStatements::finish`] with the rows `rows` (each with the index
    /// of its finish in `finishes`), in one transaction: `BEGIN` and the
    /// finish in one round trip, then the rows of the finishes it applied,
    /// one statement per [`HookRow::statement`], and `COMMIT` in another. A
    /// zombie's rows are never sent.
    ///
    /// `client` must carry nothing else meanwhile (whatever it carried would
    /// land in this transaction): the worker pool gives each completer
    /// writer a connection of its own.
    pub async fn finish_with_rows(
        &self,
        client: &Client,
        hooks: &HookStatements,
        finishes: &[Finish],
        rows: Vec<(usize, HookRow)>,
    ) -> Result<FinishReport, tokio_postgres::Error> {
        if rows.is_empty() {
            return self.finish(client, finishes).await;
        }
        // Prepared before the transaction opens, once per connection.
        let mut statements: Vec<(&'static str, Statement)> = Vec::new();
        for (_, row) in &rows {
            if !statements
                .iter()
                .any(|(text, _)| same_text(text, row.statement))
            {
                statements.push((row.statement, hooks.get(client, row.statement).await?));
            }
        }
        let params = FinishParams::new(finishes);
        let finished = {
            let (params, statements) = (&params, &statements);
            async move {
                let (_, held) = tokio::try_join!(
                    client.batch_execute("BEGIN"),
                    self.run_finish(client, params)
                )?;
                let applied =
                    applied_claims(held.iter().map(|&((id, token), a, _)| (id, token, a)));
                let mut batched = HookBatches::default();
                for (index, row) in rows {
                    let finish = &finishes[index];
                    if applied.contains(&(finish.job_id, finish.lease_token)) {
                        batched.push(row);
                    }
                }
                // Every row's statement was prepared above.
                let inserts = batched.0.into_iter().filter_map(|(text, rows)| {
                    let (_, statement) = statements.iter().find(|(t, _)| same_text(t, text))?;
                    Some(async move {
                        let rows = serde_json::Value::Array(rows);
                        client.execute(statement, &[&rows]).await
                    })
                });
                tokio::try_join!(
                    futures_util::future::try_join_all(inserts),
                    client.batch_execute("COMMIT")
                )?;
                Ok::<_, tokio_postgres::Error>(held)
            }
            .await
        };
        match finished {
            Ok(held) => Ok(params.report(held)),
            Err(error) => {
                // As the reaper's: end the failed transaction, so that the
                // connection's next statement runs on its own.
                client.batch_execute("ROLLBACK").await?;
                Err(error)
            }
        }
    }

    /// The finishing statement's rows: `((id, lease_token), applied,
    /// released)`. It sends no NOTIFY: the worker pool wakes the kinds of
    /// the dependents it released after the commit ([`FinishReport::woken_kinds`]),
    /// so this commit never holds PostgreSQL's notify lock.
    async fn run_finish(
        &self,
        client: &Client,
        params: &FinishParams,
    ) -> Result<Vec<((i64, i64), bool, Released)>, tokio_postgres::Error> {
        let no_channel: Option<&str> = None;
        let rows = query_expecting(
            client,
            &self.finish,
            &[
                &params.ids,
                &params.tokens,
                &params.statuses,
                &params.delays,
                &params.errors,
                &no_channel,
            ],
            params.ids.len(),
        )
        .await?;
        let mut finished = Vec::with_capacity(rows.len());
        for row in &rows {
            finished.push((
                (row.try_get(0)?, row.try_get(1)?),
                row.try_get(2)?,
                (row.try_get(3)?, row.try_get(4)?),
            ));
        }
        Ok(finished)
    }

    /// [`extend_leases`](crate::statements::extend_leases).
    pub async fn extend(
        &self,
        client: &Client,
        leases: &[JobLease],
        lease: std::time::Duration,
    ) -> Result<HeartbeatReport, tokio_postgres::Error> {
        if leases.is_empty() {
            return Ok(HeartbeatReport::default());
        }
        let (ids, tokens) = split(leases);
        let rows = client
            .query(&self.extend, &[&ids, &tokens, &millis(lease)])
            .await?;
        let rows = rows
            .iter()
            .map(|row| Ok(((row.try_get(0)?, row.try_get(1)?), row.try_get(2)?)))
            .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
        Ok(heartbeat_report(leases, rows))
    }

    /// [`hand_back_jobs`](crate::statements::hand_back_jobs).
    pub async fn hand_back(
        &self,
        client: &Client,
        leases: &[JobLease],
    ) -> Result<Vec<i64>, tokio_postgres::Error> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let (ids, tokens) = split(leases);
        let rows = client.query(&self.hand_back, &[&ids, &tokens]).await?;
        rows.iter().map(|row| row.try_get(0)).collect()
    }
}

impl HotStatements {
    /// [`reap_expired_leases`](crate::statements::reap_expired_leases): its two
    /// statements in one transaction, opened with `BEGIN` on `client`.
    ///
    /// `client` must be a connection nobody else sends statements on while
    /// this runs (the worker pool gives its reaper a connection of its own), since
    /// whatever else it carried would run inside this transaction. The row
    /// locks of the select hold until the update has moved the rows: that is
    /// what keeps two reapers off one job.
    pub async fn reap(
        &self,
        client: &Client,
        request: &ReapRequest<'_>,
        retry_delay: impl Fn(i32) -> std::time::Duration,
    ) -> Result<ReapReport, tokio_postgres::Error> {
        client.batch_execute("BEGIN").await?;
        let reaped = async {
            let rows = client
                .query(
                    &self.select_expired,
                    &[&request.limit, &millis(request.margin), &request.spare],
                )
                .await?;
            let expired = rows
                .iter()
                .map(|row| {
                    Ok(ExpiredRow {
                        id: row.try_get(0)?,
                        attempts: row.try_get(1)?,
                        max_attempts: row.try_get(2)?,
                        locked_by: row.try_get(3)?,
                        lease_token: row.try_get(4)?,
                    })
                })
                .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
            let Some(plan) = ReapPlan::new(&expired, retry_delay) else {
                return Ok(ReapReport::default());
            };
            let params = &plan.params;
            client
                .query(
                    &self.update_reaped,
                    &[
                        &params.ids,
                        &params.tokens,
                        &params.statuses,
                        &params.delays,
                        &params.errors,
                        &NOTIFY_CHANNEL,
                    ],
                )
                .await?;
            Ok(plan.report)
        }
        .await;
        match reaped {
            Ok(report) => {
                client.batch_execute("COMMIT").await?;
                Ok(report)
            }
            Err(error) => {
                // A failed statement leaves the transaction aborted: end it,
                // so that the connection's next statement runs on its own.
                // Where even that fails the connection is broken, and that
                // error (not the first) is what tells the caller to drop it.
                client.batch_execute("ROLLBACK").await?;
                Err(error)
            }
        }
    }

    /// [`advance_stranded_keys`](crate::statements::advance_stranded_keys): the
    /// sweep's two statements, each on its own snapshot as there.
    pub async fn advance_stranded(
        &self,
        client: &Client,
        limit: i64,
    ) -> Result<Vec<i64>, tokio_postgres::Error> {
        let keys = client
            .query(&self.stranded_keys, &[&limit])
            .await?
            .iter()
            .map(|row| row.try_get(0))
            .collect::<Result<Vec<String>, _>>()?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        client
            .query(&self.advance_keys, &[&keys])
            .await?
            .iter()
            .map(|row| row.try_get(0))
            .collect()
    }
}

/// The statements of [`HookRow`]s, prepared on one connection the first time
/// each comes (their texts are the application's, unknown until then).
#[derive(Debug, Default)]
pub struct HookStatements(Mutex<HashMap<&'static str, Statement>>);

impl HookStatements {
    /// `text` prepared on `client` (whose statements these are), with its
    /// one parameter, a JSON array of rows.
    async fn get(
        &self,
        client: &Client,
        text: &'static str,
    ) -> Result<Statement, tokio_postgres::Error> {
        if let Some(statement) = self.lock().get(text) {
            return Ok(statement.clone());
        }
        let statement = client.prepare_typed(text, &[Type::JSONB]).await?;
        self.lock().insert(text, statement.clone());
        Ok(statement)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<&'static str, Statement>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
