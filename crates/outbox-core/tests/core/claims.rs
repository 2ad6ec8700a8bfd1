//! The live claims (`job_claims`): a row per claim statement, renewed or
//! dropped by the heartbeat.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Text, Timestamptz};
use outbox_core::statements::{
    ClaimRequest, ClaimedJob, Finish, JobLease, Outcome, claim_jobs, extend_leases, finish_jobs,
};

use crate::support::TestDb;

const LEASE: Duration = Duration::from_secs(60);

fn pending(conn: &mut PgConnection, n: i64) {
    diesel::sql_query("INSERT INTO jobs (kind) SELECT 'noop' FROM generate_series(1, $1)")
        .bind::<BigInt, _>(n)
        .execute(conn)
        .expect("enqueue");
}

fn claim(conn: &mut PgConnection, worker: &str, limit: i64) -> Vec<ClaimedJob> {
    let kinds = vec!["noop".to_owned()];
    claim_jobs(
        conn,
        &ClaimRequest {
            worker_id: worker,
            kinds: &kinds,
            limit,
            lease: LEASE,
        },
    )
    .expect("claim")
}

fn leases(jobs: &[ClaimedJob]) -> Vec<JobLease> {
    jobs.iter()
        .map(|j| JobLease {
            job_id: j.id,
            lease_token: j.lease_token,
        })
        .collect()
}

fn done(conn: &mut PgConnection, jobs: &[ClaimedJob]) {
    let finishes: Vec<Finish> = jobs
        .iter()
        .map(|j| Finish {
            job_id: j.id,
            lease_token: j.lease_token,
            outcome: Outcome::Done { local: None },
        })
        .collect();
    let report = finish_jobs(conn, &finishes).expect("finish");
    assert_eq!(report.applied.len(), jobs.len());
}

#[derive(QueryableByName, Debug, PartialEq)]
struct ClaimRow {
    #[diesel(sql_type = Text)]
    locked_by: String,
    #[diesel(sql_type = Timestamptz)]
    expires_at: DateTime<Utc>,
    #[diesel(sql_type = Array<BigInt>)]
    job_ids: Vec<i64>,
    #[diesel(sql_type = Array<BigInt>)]
    lease_tokens: Vec<i64>,
}

fn claim_rows(conn: &mut PgConnection) -> Vec<ClaimRow> {
    diesel::sql_query(
        "SELECT locked_by, expires_at, job_ids, lease_tokens FROM job_claims ORDER BY id",
    )
    .load(conn)
    .expect("job_claims")
}

fn lease_of(conn: &mut PgConnection, id: i64) -> DateTime<Utc> {
    #[derive(QueryableByName)]
    struct Lease {
        #[diesel(sql_type = Timestamptz)]
        lease_expires_at: DateTime<Utc>,
    }
    diesel::sql_query("SELECT lease_expires_at FROM jobs WHERE id = $1")
        .bind::<BigInt, _>(id)
        .get_result::<Lease>(conn)
        .expect("lease")
        .lease_expires_at
}

#[test]
fn a_claim_writes_one_row_that_the_heartbeat_renews_and_drops_once_its_jobs_end() {
    let db = TestDb::new();
    let mut conn = db.conn();
    pending(&mut conn, 5);

    let first = claim(&mut conn, "w", 3);
    let second = claim(&mut conn, "w", 2);
    assert!(claim(&mut conn, "w", 2).is_empty());

    let rows = claim_rows(&mut conn);
    assert_eq!(rows.len(), 2, "one row a claim that took jobs: {rows:?}");
    assert_eq!(rows[0].locked_by, "w");
    assert_eq!(
        rows[0].job_ids,
        first.iter().map(|j| j.id).collect::<Vec<_>>()
    );
    assert_eq!(
        rows[0].lease_tokens,
        first.iter().map(|j| j.lease_token).collect::<Vec<_>>()
    );
    assert_eq!(rows[0].expires_at, lease_of(&mut conn, first[0].id));

    // The first claim's jobs end; the second's are still running.
    done(&mut conn, &first);
    std::thread::sleep(Duration::from_millis(20));
    let beat = extend_leases(&mut conn, &leases(&second), LEASE).expect("heartbeat");
    assert_eq!(beat.extended.len(), 2);

    let rows = claim_rows(&mut conn);
    assert_eq!(rows.len(), 1, "the ended claim's row is gone: {rows:?}");
    assert_eq!(
        rows[0].job_ids,
        second.iter().map(|j| j.id).collect::<Vec<_>>()
    );
    assert_eq!(
        rows[0].expires_at,
        lease_of(&mut conn, second[0].id),
        "renewed with its jobs"
    );
}

/// The reaper must see a lease as soon as it expires, so a row moves only as
/// far as every job it still holds.
#[test]
fn a_row_is_renewed_only_when_every_job_it_holds_was() {
    let db = TestDb::new();
    let mut conn = db.conn();
    pending(&mut conn, 2);
    let claimed = claim(&mut conn, "w", 2);
    let claimed_until = claim_rows(&mut conn)[0].expires_at;
    std::thread::sleep(Duration::from_millis(20));

    extend_leases(&mut conn, &leases(&claimed[..1]), LEASE).expect("heartbeat");
    assert_eq!(
        claim_rows(&mut conn)[0].expires_at,
        claimed_until,
        "its other job was not renewed"
    );

    extend_leases(&mut conn, &leases(&claimed), LEASE).expect("heartbeat");
    assert_eq!(
        claim_rows(&mut conn)[0].expires_at,
        lease_of(&mut conn, claimed[1].id)
    );
}
