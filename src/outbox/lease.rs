//! Leases of in-flight jobs: the heartbeat that extends them and the release of
//! jobs a relay claimed but will not run.

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Integer, Text};

use super::claim::millis;

/// A job a worker holds: its id and the attempt it was claimed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct JobLease {
    pub job_id: i64,
    pub attempt: i32,
}

#[derive(QueryableByName)]
struct IdRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

fn split(leases: &[JobLease]) -> (Vec<i64>, Vec<i32>) {
    leases.iter().map(|l| (l.job_id, l.attempt)).unzip()
}

/// Extends the leases of `leases` to now + `lease`; returns the ids still owned.
pub fn extend_leases(
    conn: &mut PgConnection,
    worker_id: &str,
    leases: &[JobLease],
    lease: Duration,
) -> QueryResult<Vec<i64>> {
    if leases.is_empty() {
        return Ok(Vec::new());
    }
    let (ids, attempts) = split(leases);
    let rows: Vec<IdRow> = diesel::sql_query(include_str!("sql/extend_leases.sql"))
        .bind::<Array<BigInt>, _>(&ids)
        .bind::<Array<Integer>, _>(&attempts)
        .bind::<BigInt, _>(millis(lease))
        .bind::<Text, _>(worker_id)
        .load(conn)?;
    Ok(rows.into_iter().map(|r| r.id).collect())
}

/// Returns claimed-but-unstarted jobs to `pending` without spending an attempt.
/// Returns the ids released.
pub fn release_jobs(
    conn: &mut PgConnection,
    worker_id: &str,
    leases: &[JobLease],
) -> QueryResult<Vec<i64>> {
    if leases.is_empty() {
        return Ok(Vec::new());
    }
    let (ids, attempts) = split(leases);
    let rows: Vec<IdRow> = diesel::sql_query(include_str!("sql/release_jobs.sql"))
        .bind::<Array<BigInt>, _>(&ids)
        .bind::<Array<Integer>, _>(&attempts)
        .bind::<Text, _>(worker_id)
        .load(conn)?;
    Ok(rows.into_iter().map(|r| r.id).collect())
}
