//! The reaper: expired leases back to `pending` (with backoff) or to `failed`.

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Integer, Nullable, Text};

use super::claim::millis;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReapReport {
    /// Jobs returned to `pending` for another attempt.
    pub requeued: usize,
    /// Jobs that had used their last attempt and are now `failed`.
    pub failed: usize,
}

impl ReapReport {
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
}

/// Reaps up to `limit` expired leases in one transaction. `retry_delay(attempt)`
/// is the backoff before the next attempt (the relay's retry policy).
pub fn reap_expired_leases(
    conn: &mut PgConnection,
    limit: i64,
    retry_delay: impl Fn(i32) -> Duration,
) -> QueryResult<ReapReport> {
    reap_expired_leases_sparing(conn, limit, &Spare::default(), retry_delay)
}

/// Jobs a reaper leaves alone although their lease expired: those its own
/// relay is still running (see `sql/select_expired_leases.sql`).
#[derive(Debug, Clone, Default)]
pub struct Spare<'a> {
    pub worker_id: &'a str,
    pub job_ids: &'a [i64],
}

/// [`reap_expired_leases`], leaving `spare`'s jobs alone.
pub fn reap_expired_leases_sparing(
    conn: &mut PgConnection,
    limit: i64,
    spare: &Spare<'_>,
    retry_delay: impl Fn(i32) -> Duration,
) -> QueryResult<ReapReport> {
    conn.transaction(|conn| {
        let expired: Vec<ExpiredRow> =
            diesel::sql_query(include_str!("sql/select_expired_leases.sql"))
                .bind::<BigInt, _>(limit)
                .bind::<Text, _>(spare.worker_id)
                .bind::<Array<BigInt>, _>(spare.job_ids)
                .load(conn)?;
        if expired.is_empty() {
            return Ok(ReapReport::default());
        }
        let mut report = ReapReport::default();
        let mut ids = Vec::with_capacity(expired.len());
        let mut statuses = Vec::with_capacity(expired.len());
        let mut delays = Vec::with_capacity(expired.len());
        let mut errors = Vec::with_capacity(expired.len());
        for row in &expired {
            let owner = row.locked_by.as_deref().unwrap_or("unknown worker");
            ids.push(row.id);
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
                statuses.push("pending");
                delays.push(millis(retry_delay(row.attempts)));
                errors.push(format!(
                    "lease expired on attempt {} of {} (worker {owner} stopped renewing it)",
                    row.attempts, row.max_attempts
                ));
            }
        }
        diesel::sql_query(include_str!("sql/update_reaped_jobs.sql"))
            .bind::<Array<BigInt>, _>(&ids)
            .bind::<Array<Text>, _>(&statuses)
            .bind::<Array<BigInt>, _>(&delays)
            .bind::<Array<Text>, _>(&errors)
            .execute(conn)?;
        Ok(report)
    })
}
