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

#[derive(QueryableByName)]
struct ExpiredRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Integer)]
    attempts: i32,
    #[diesel(sql_type = Integer)]
    max_attempts: i32,
    #[diesel(sql_type = Nullable<Text>)]
    locked_by: Option<String>,
    #[diesel(sql_type = BigInt)]
    lease_token: i64,
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
        let expired: Vec<ExpiredRow> =
            diesel::sql_query(include_str!("sql/select_expired_leases.sql"))
                .bind::<BigInt, _>(request.limit)
                .bind::<BigInt, _>(millis(request.margin))
                .bind::<Array<BigInt>, _>(request.spare)
                .load(conn)?;
        if expired.is_empty() {
            return Ok(ReapReport::default());
        }
        let mut report = ReapReport::default();
        let mut ids = Vec::with_capacity(expired.len());
        let mut tokens = Vec::with_capacity(expired.len());
        let mut statuses = Vec::with_capacity(expired.len());
        let mut delays = Vec::with_capacity(expired.len());
        let mut errors = Vec::with_capacity(expired.len());
        for row in &expired {
            let owner = row.locked_by.as_deref().unwrap_or("unknown worker");
            ids.push(row.id);
            tokens.push(row.lease_token);
            if row.attempts >= row.max_attempts {
                report.failed += 1;
                statuses.push("failed");
                delays.push(0);
                errors.push(format!(
                    "lease expired on attempt {} of {} (worker {owner} stopped renewing it); no attempts left",
                    row.attempts, row.max_attempts
                ));
            } else {
                report.requeued += 1;
                let delay = retry_delay(row.attempts);
                report.next_due = Some(report.next_due.map_or(delay, |d: Duration| d.min(delay)));
                statuses.push("pending");
                delays.push(millis(delay));
                errors.push(format!(
                    "lease expired on attempt {} of {} (worker {owner} stopped renewing it)",
                    row.attempts, row.max_attempts
                ));
            }
        }
        diesel::sql_query(include_str!("sql/update_reaped_jobs.sql"))
            .bind::<Array<BigInt>, _>(&ids)
            .bind::<Array<BigInt>, _>(&tokens)
            .bind::<Array<Text>, _>(&statuses)
            .bind::<Array<BigInt>, _>(&delays)
            .bind::<Array<Text>, _>(&errors)
            .execute(conn)?;
        Ok(report)
    })
}
