//! The reaper: expired leases back to `pending` (with backoff) or to `failed`.

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Integer, Nullable, Text};

use super::claim::millis;
use super::finish::{Finish, FinishParams, Outcome};

/// What one [`reap_expired_leases`] call did. Each reaped job had its lease
/// token's claim ended: a worker still running it is fenced out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReapReport {
    /// Jobs returned to `pending` for another attempt.
    pub requeued: usize,
    /// Jobs that had used their last attempt and are now `failed`.
    pub failed: usize,
    /// The shortest backoff given to a requeued job: when the first of them
    /// is due again.
    pub next_due: Option<Duration>,
}

impl ReapReport {
    /// Every job reaped: requeued plus failed. Less than the request's
    /// `limit` means no more expired leases were found (that were not locked
    /// by another reaper).
    pub fn total(&self) -> usize {
        self.requeued + self.failed
    }
}

/// One row of `sql/select_expired_leases.sql`.
#[derive(QueryableByName)]
pub(crate) struct ExpiredRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) id: i64,
    #[diesel(sql_type = Integer)]
    pub(crate) attempts: i32,
    #[diesel(sql_type = Integer)]
    pub(crate) max_attempts: i32,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) locked_by: Option<String>,
    #[diesel(sql_type = BigInt)]
    pub(crate) lease_token: i64,
}

/// Which expired leases a reaper takes.
#[derive(Debug, Clone, Default)]
pub struct ReapRequest<'a> {
    /// Most jobs reaped by one call (one transaction).
    pub limit: i64,
    /// Only leases expired longer ago than this: a worker pool back from a short
    /// blip renews its own leases first (see `sql/select_expired_leases.sql`).
    pub margin: Duration,
    /// Lease tokens of the claims the reaper's own worker pool is still running.
    pub spare: &'a [i64],
}

impl ReapRequest<'_> {
    /// Up to `limit` jobs, no margin, nothing spared.
    pub fn new(limit: i64) -> ReapRequest<'static> {
        ReapRequest {
            limit,
            margin: Duration::ZERO,
            spare: &[],
        }
    }
}

/// Reaps the expired leases `request` selects, in one transaction.
/// `retry_delay(attempt)` is the backoff before the next attempt (the worker pool's
/// retry policy).
pub fn reap_expired_leases(
    conn: &mut PgConnection,
    request: &ReapRequest<'_>,
    retry_delay: impl Fn(i32) -> Duration,
) -> QueryResult<ReapReport> {
    conn.transaction(|conn| {
        let expired: Vec<ExpiredRow> = diesel::sql_query(SELECT_EXPIRED_SQL)
            .bind::<BigInt, _>(request.limit)
            .bind::<BigInt, _>(millis(request.margin))
            .bind::<Array<BigInt>, _>(request.spare)
            .load(conn)?;
        let Some(plan) = ReapPlan::new(&expired, retry_delay) else {
            return Ok(ReapReport::default());
        };
        let params = &plan.params;
        diesel::sql_query(UPDATE_REAPED_SQL)
            .bind::<Array<BigInt>, _>(&params.ids)
            .bind::<Array<BigInt>, _>(&params.tokens)
            .bind::<Array<Text>, _>(&params.statuses)
            .bind::<Array<BigInt>, _>(&params.delays)
            .bind::<Array<Nullable<Text>>, _>(&params.errors)
            .bind::<Text, _>(super::NOTIFY_CHANNEL)
            .execute(conn)?;
        Ok(plan.report)
    })
}

pub(crate) const SELECT_EXPIRED_SQL: &str = include_str!("sql/select_expired_leases.sql");
pub(crate) const UPDATE_REAPED_SQL: &str = include_str!("sql/update_reaped_jobs.sql");

/// What the reaper writes for the expired leases it selected, and the report
/// it makes. Each reaped job is an outcome like a completer's (a retry after
/// backoff, or a failure), so the statement's parameters are the finish's
/// ([`FinishParams`]: the same five arrays, errors cleaned alike). Shared by
/// the Diesel path above and the prepared one (`outbox/prepared.rs`), so both
/// decide alike.
pub(crate) struct ReapPlan {
    pub(crate) params: FinishParams,
    pub(crate) report: ReapReport,
}

impl ReapPlan {
    /// `None` when nothing expired.
    pub(crate) fn new(
        expired: &[ExpiredRow],
        retry_delay: impl Fn(i32) -> Duration,
    ) -> Option<ReapPlan> {
        if expired.is_empty() {
            return None;
        }
        let mut report = ReapReport::default();
        let finishes: Vec<Finish> = expired
            .iter()
            .map(|row| {
                let owner = row.locked_by.as_deref().unwrap_or("unknown worker");
                let lapsed = format!(
                    "lease expired on attempt {} of {} (worker {owner} stopped renewing it)",
                    row.attempts, row.max_attempts
                );
                let outcome = if row.attempts >= row.max_attempts {
                    report.failed += 1;
                    Outcome::Failed {
                        error: format!("{lapsed}; no attempts left"),
                    }
                } else {
                    report.requeued += 1;
                    let delay = retry_delay(row.attempts);
                    report.next_due = Some(report.next_due.map_or(delay, |d| d.min(delay)));
                    Outcome::Retry {
                        delay,
                        error: lapsed,
                    }
                };
                Finish {
                    job_id: row.id,
                    lease_token: row.lease_token,
                    outcome,
                }
            })
            .collect();
        Some(ReapPlan {
            params: FinishParams::new(&finishes),
            report,
        })
    }
}
