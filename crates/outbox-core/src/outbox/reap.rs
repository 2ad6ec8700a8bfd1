//! The reaper: expired leases back to `pending` (with backoff) or to `failed`.

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Integer, Nullable, Text};

use super::claim::millis;

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
    /// Only leases expired longer ago than this: a relay back from a short
    /// blip renews its own leases first (see `sql/select_expired_leases.sql`).
    pub margin: Duration,
    /// Lease tokens of the claims the reaper's own relay is still running.
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
/// `retry_delay(attempt)` is the backoff before the next attempt (the relay's
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
        diesel::sql_query(UPDATE_REAPED_SQL)
            .bind::<Array<BigInt>, _>(&plan.ids)
            .bind::<Array<BigInt>, _>(&plan.tokens)
            .bind::<Array<Text>, _>(&plan.statuses)
            .bind::<Array<BigInt>, _>(&plan.delays)
            .bind::<Array<Text>, _>(&plan.errors)
            .execute(conn)?;
        Ok(plan.report)
    })
}

pub(crate) const SELECT_EXPIRED_SQL: &str = include_str!("sql/select_expired_leases.sql");
pub(crate) const UPDATE_REAPED_SQL: &str = include_str!("sql/update_reaped_jobs.sql");

/// What the reaper writes for the expired leases it selected: the parameters
/// of `sql/update_reaped_jobs.sql`, and the report they make. Shared by the
/// Diesel path above and the prepared one (`outbox/prepared.rs`), so both
/// decide alike.
pub(crate) struct ReapPlan {
    pub(crate) ids: Vec<i64>,
    pub(crate) tokens: Vec<i64>,
    pub(crate) statuses: Vec<&'static str>,
    pub(crate) delays: Vec<i64>,
    pub(crate) errors: Vec<String>,
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
        let mut plan = ReapPlan {
            ids: Vec::with_capacity(expired.len()),
            tokens: Vec::with_capacity(expired.len()),
            statuses: Vec::with_capacity(expired.len()),
            delays: Vec::with_capacity(expired.len()),
            errors: Vec::with_capacity(expired.len()),
            report: ReapReport::default(),
        };
        for row in expired {
            let owner = row.locked_by.as_deref().unwrap_or("unknown worker");
            plan.ids.push(row.id);
            plan.tokens.push(row.lease_token);
            if row.attempts >= row.max_attempts {
                plan.report.failed += 1;
                plan.statuses.push("failed");
                plan.delays.push(0);
                plan.errors.push(format!(
                    "lease expired on attempt {} of {} (worker {owner} stopped renewing it); no attempts left",
                    row.attempts, row.max_attempts
                ));
            } else {
                plan.report.requeued += 1;
                let delay = retry_delay(row.attempts);
                plan.report.next_due = Some(
                    plan.report
                        .next_due
                        .map_or(delay, |d: Duration| d.min(delay)),
                );
                plan.statuses.push("pending");
                plan.delays.push(millis(delay));
                plan.errors.push(format!(
                    "lease expired on attempt {} of {} (worker {owner} stopped renewing it)",
                    row.attempts, row.max_attempts
                ));
            }
        }
        Some(plan)
    }
}
