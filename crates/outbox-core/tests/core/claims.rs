//! The live claims (`job_claims`): a row per claim statement, renewed or
//! dropped by the heartbeat, read and dropped by the reaper, which finds
//! expired leases there instead of in the backlog.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Text, Timestamptz};
use outbox_core::statements::{
    ClaimRequest, ClaimedJob, Finish, Outcome, ReapRequest, claim_jobs, extend_leases, finish_jobs,
    reap_expired_leases,
};

use crate::support::{TestDb, leases};

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

fn expire(conn: &mut PgConnection, ids: &[i64]) {
    diesel::sql_query(
        "UPDATE jobs SET lease_expires_at = now() - interval '1 hour' WHERE id = ANY($1)",
    )
    .bind::<Array<BigInt>, _>(ids)
    .execute(conn)
    .expect("expire the leases");
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

#[test]
fn the_reaper_finds_expired_leases_through_their_row_and_drops_it_once_emptied() {
    let db = TestDb::new();
    let mut conn = db.conn();
    pending(&mut conn, 2);
    let crashed = claim(&mut conn, "crashed", 2);
    let ids: Vec<i64> = crashed.iter().map(|j| j.id).collect();
    expire(&mut conn, &ids);
    assert!(
        claim_rows(&mut conn)[0].expires_at < Utc::now(),
        "the row follows a lease moved earlier"
    );

    // One of them is locked elsewhere: it and its row wait for the next pass.
    let mut operator = db.conn();
    diesel::connection::SimpleConnection::batch_execute(&mut operator, "BEGIN")
        .expect("the operator's transaction");
    diesel::sql_query("SELECT id FROM jobs WHERE id = $1 FOR UPDATE")
        .bind::<BigInt, _>(ids[0])
        .execute(&mut operator)
        .expect("lock the row");
    let report =
        reap_expired_leases(&mut conn, &ReapRequest::new(10), |_| Duration::ZERO).expect("reap");
    assert_eq!(report.requeued, 1);
    assert_eq!(claim_rows(&mut conn).len(), 1, "it still holds a job");

    diesel::connection::SimpleConnection::batch_execute(&mut operator, "ROLLBACK")
        .expect("end the operator's transaction");
    let report =
        reap_expired_leases(&mut conn, &ReapRequest::new(10), |_| Duration::ZERO).expect("reap");
    assert_eq!(report.requeued, 1);
    assert!(
        claim_rows(&mut conn).is_empty(),
        "dropped in the pass that emptied it"
    );
}

#[derive(QueryableByName)]
struct PlanJson {
    #[diesel(sql_type = Text, column_name = "QUERY PLAN")]
    plan: String,
}

/// Every node of `plan` that reads `relation`: (node type, rows it looked
/// at: returned over all loops plus those its filters removed).
fn reads_of(plan: &serde_json::Value, relation: &str, out: &mut Vec<(String, f64)>) {
    if plan.get("Relation Name").and_then(|r| r.as_str()) == Some(relation) {
        let number = |key: &str| plan.get(key).and_then(|v| v.as_f64()).unwrap_or(0.0);
        let looked_at = number("Actual Rows") * number("Actual Loops")
            + number("Rows Removed by Filter")
            + number("Rows Removed by Index Recheck");
        let node = plan["Node Type"].as_str().unwrap_or_default().to_owned();
        out.push((node, looked_at));
    }
    if let Some(children) = plan.get("Plans").and_then(|p| p.as_array()) {
        for child in children {
            reads_of(child, relation, out);
        }
    }
}

/// The reaper's first pass was a sequential scan of the whole backlog. Now
/// it reads the expired claims' rows and probes their jobs by id: what it
/// looks at in `jobs` is bounded by the expired leases, however many jobs
/// wait behind them.
#[test]
fn under_a_deep_backlog_the_reaper_reads_only_the_jobs_of_expired_claims() {
    let db = TestDb::new();
    let mut conn = db.conn();
    pending(&mut conn, 100_000);
    let crashed = claim(&mut conn, "crashed", 8);
    claim(&mut conn, "alive", 8);
    let ids: Vec<i64> = crashed.iter().map(|j| j.id).collect();
    expire(&mut conn, &ids);
    diesel::sql_query("ANALYZE jobs")
        .execute(&mut conn)
        .expect("analyze");

    let explain = format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) {}",
        include_str!("../../src/outbox/sql/select_expired_leases.sql")
            .replace("$1", "500")
            .replace("$2", "0")
            .replace("$3", "'{}'")
    );
    // EXPLAIN ANALYZE runs the statement: its locks and deletes roll back.
    let mut plan = String::new();
    let _rolled_back = conn.transaction::<(), _, _>(|conn| {
        plan = diesel::sql_query(&explain)
            .get_result::<PlanJson>(conn)
            .expect("explain")
            .plan;
        Err(diesel::result::Error::RollbackTransaction)
    });
    let plan: serde_json::Value = serde_json::from_str(&plan).expect("a JSON plan");
    let mut reads = Vec::new();
    reads_of(&plan[0]["Plan"], "jobs", &mut reads);

    assert!(!reads.is_empty(), "it reads jobs: {plan}");
    assert!(
        reads.iter().all(|(node, _)| !node.contains("Seq Scan")),
        "a sequential scan of jobs: {reads:?}"
    );
    assert!(
        reads.iter().all(|(_, rows)| *rows <= ids.len() as f64),
        "each read of jobs looks at the expired claim's {} jobs at most: {reads:?}",
        ids.len()
    );
    assert_eq!(
        reap_expired_leases(&mut conn, &ReapRequest::new(500), |_| Duration::ZERO)
            .expect("reap")
            .requeued,
        ids.len()
    );
}

/// A worker pool draining the queue leaves at most the rows of its claims
/// still running behind it (its heartbeat drops the others), and the rows of
/// its last claims, which no heartbeat sees once their jobs ended, are
/// dropped by the first reaper pass after they expire: the table never grows
/// with the jobs drained.
#[test]
fn through_a_drain_the_rows_stay_bounded_and_the_last_go_once_expired() {
    let db = TestDb::new();
    let mut conn = db.conn();
    pending(&mut conn, 40);

    let mut running = claim(&mut conn, "w", 4);
    loop {
        let next = claim(&mut conn, "w", 4);
        done(&mut conn, &running);
        extend_leases(&mut conn, &leases(&next), LEASE).expect("heartbeat");
        let rows = claim_rows(&mut conn);
        assert!(rows.len() <= 1, "only the running claim's row: {rows:?}");
        running = next;
        if running.is_empty() {
            break;
        }
    }
    // The last claim's row: nothing renewed or dropped it with its jobs.
    let rows = claim_rows(&mut conn);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].job_ids.len(), 4);

    // Its lease runs out (as time would move it, past its jobs' end).
    diesel::sql_query("UPDATE job_claims SET expires_at = now() - interval '1 hour'")
        .execute(&mut conn)
        .expect("expire the row");
    let report =
        reap_expired_leases(&mut conn, &ReapRequest::new(10), |_| Duration::ZERO).expect("reap");
    assert_eq!(report.total(), 0, "its jobs had ended");
    assert!(claim_rows(&mut conn).is_empty(), "and it is gone");
}

/// A row's jobs are looked up by (id, token): a job of an expired row that
/// was reaped and then claimed again belongs to its new claim, so the old row
/// goes while the job, running under a live lease, stays where it is.
#[test]
fn a_row_whose_job_runs_under_a_newer_claim_is_dropped_and_the_job_kept() {
    let db = TestDb::new();
    let mut conn = db.conn();
    pending(&mut conn, 1);
    let first = claim(&mut conn, "crashed", 1);
    // An old row that outlived its claim, as if a reaper had been stopped
    // between the job's reap and the row's delete.
    diesel::sql_query("UPDATE jobs SET status = 'pending', locked_by = NULL, locked_at = NULL, lease_expires_at = NULL")
        .execute(&mut conn)
        .expect("requeue by hand");
    let second = claim(&mut conn, "alive", 1);
    assert_eq!(first[0].id, second[0].id);
    diesel::sql_query(
        "UPDATE job_claims SET expires_at = now() - interval '1 hour' WHERE locked_by = 'crashed'",
    )
    .execute(&mut conn)
    .expect("expire the old row");

    let report =
        reap_expired_leases(&mut conn, &ReapRequest::new(10), |_| Duration::ZERO).expect("reap");
    assert_eq!(report.total(), 0, "the job's live lease is not reaped");
    let rows = claim_rows(&mut conn);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].locked_by, "alive");
    assert_eq!(rows[0].lease_tokens, vec![second[0].lease_token]);
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Noop {}

impl outbox_core::worker::JobArgs for Noop {
    const KIND: &'static str = "noop";
}

/// A claim marks standalone the jobs whose `done` changes no other row (no
/// ordering key, no concurrency key, no dependent), and only those: the
/// worker pool sends their outcomes to the shorter finish.
#[test]
fn the_claim_marks_standalone_only_jobs_whose_end_touches_no_other_row() {
    use outbox_core::outbox::{Enqueuer, JobOptions};

    let db = TestDb::new();
    let mut conn = db.conn();
    let enqueuer = Enqueuer::new();
    let mut enqueue = |options: JobOptions| {
        enqueuer
            .enqueue(&mut conn, &Noop {}, &options)
            .expect("enqueue")
    };
    let plain = enqueue(JobOptions::default());
    let ordered = enqueue(JobOptions::default().ordering_key("k"));
    let limited = enqueue(JobOptions::default().concurrency_key("c"));
    let parent = enqueue(JobOptions::default());
    enqueue(JobOptions::default().depends_on([parent]));
    // A writer that knows nothing of `has_dependents` leaves it unknown.
    let unknown: i64 = diesel::sql_query("INSERT INTO jobs (kind) VALUES ('noop') RETURNING id")
        .get_result::<Id>(&mut conn)
        .expect("a plain insert")
        .id;

    let marks: Vec<(i64, bool)> = claim(&mut conn, "w", 10)
        .iter()
        .map(|j| (j.id, j.standalone))
        .collect();
    let mut expected = vec![
        (plain, true),
        (ordered, false),
        (limited, false),
        (parent, false),
        (unknown, false),
    ];
    expected.sort_unstable();
    let mut marks = marks;
    marks.sort_unstable();
    assert_eq!(marks, expected);
}

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}
