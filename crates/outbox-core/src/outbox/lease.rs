//! Leases of in-flight jobs: the heartbeat that extends them and the release of
//! jobs a worker pool claimed but will not run.

use std::collections::HashMap;
use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool};

use super::claim::millis;
pub use super::fence::JobLease;

/// What one heartbeat found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeartbeatReport {
    /// Claims whose lease now runs to now + lease.
    pub extended: Vec<JobLease>,
    /// Claims still held but whose row another transaction had locked; their
    /// lease is unchanged and the next beat tries again.
    pub busy: Vec<JobLease>,
    /// Claims no longer held: reaped, re-claimed, cancelled or finished.
    pub lost: Vec<JobLease>,
}

#[derive(QueryableByName)]
struct HeldRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = BigInt)]
    lease_token: i64,
    #[diesel(sql_type = Bool)]
    extended: bool,
}

#[derive(QueryableByName)]
struct IdRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

pub(crate) fn split(leases: &[JobLease]) -> (Vec<i64>, Vec<i64>) {
    leases.iter().map(|l| (l.job_id, l.lease_token)).unzip()
}

/// Extends the leases of `leases` to now + `lease`. See `sql/extend_leases.sql`.
pub fn extend_leases(
    conn: &mut PgConnection,
    leases: &[JobLease],
    lease: Duration,
) -> QueryResult<HeartbeatReport> {
    if leases.is_empty() {
        return Ok(HeartbeatReport::default());
    }
    let (ids, tokens) = split(leases);
    let rows: Vec<HeldRow> = diesel::sql_query(EXTEND_SQL)
        .bind::<Array<BigInt>, _>(&ids)
        .bind::<Array<BigInt>, _>(&tokens)
        .bind::<BigInt, _>(millis(lease))
        .load(conn)?;
    Ok(heartbeat_report(
        leases,
        rows.into_iter()
            .map(|r| ((r.id, r.lease_token), r.extended)),
    ))
}

/// The heartbeat's statement (`sql/extend_leases.sql`).
pub(crate) const EXTEND_SQL: &str = include_str!("sql/extend_leases.sql");
/// The release's statement (`sql/hand_back_jobs.sql`).
pub(crate) const HAND_BACK_SQL: &str = include_str!("sql/hand_back_jobs.sql");

/// The report from the heartbeat statement's rows `((id, token), extended)`.
/// Keyed by the token too: a worker pool may hold a stale claim of a job beside its
/// current one (its own claim reaped, then claimed again), and only the
/// current one is extended.
pub(crate) fn heartbeat_report(
    leases: &[JobLease],
    rows: impl IntoIterator<Item = ((i64, i64), bool)>,
) -> HeartbeatReport {
    let held: HashMap<(i64, i64), bool> = rows.into_iter().collect();
    let mut report = HeartbeatReport::default();
    for lease in leases {
        match held.get(&(lease.job_id, lease.lease_token)) {
            Some(true) => report.extended.push(*lease),
            Some(false) => report.busy.push(*lease),
            None => report.lost.push(*lease),
        }
    }
    report
}

/// Returns claimed-but-unstarted jobs to `pending` without spending an attempt.
/// Returns the ids released.
pub fn hand_back_jobs(conn: &mut PgConnection, leases: &[JobLease]) -> QueryResult<Vec<i64>> {
    if leases.is_empty() {
        return Ok(Vec::new());
    }
    let (ids, tokens) = split(leases);
    let rows: Vec<IdRow> = diesel::sql_query(HAND_BACK_SQL)
        .bind::<Array<BigInt>, _>(&ids)
        .bind::<Array<BigInt>, _>(&tokens)
        .load(conn)?;
    Ok(rows.into_iter().map(|r| r.id).collect())
}
