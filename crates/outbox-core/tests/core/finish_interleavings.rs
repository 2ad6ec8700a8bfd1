//! The finish against writes that commit while it runs. It writes the row
//! version its locking read took, by ctid, under the statement's snapshot; a
//! write committed between that snapshot and the lock (a heartbeat's lease
//! extension, a reap and a new claim) leaves a version the snapshot cannot
//! see. Whatever commits there, an outcome is applied at most once, only
//! under its own claim, and one not applied is answered busy (written again)
//! or lost, never dropped while still held.
//!
//! The interleaving is forced: the finish under test is the real statement
//! made to wait on an advisory lock after its snapshot is taken, where it
//! computes the ids its locking read probes.

use std::sync::Arc;
use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use outbox_core::statements::{
    ClaimedJob, Finish, FinishReport, HotStatements, Outcome, ReapRequest, extend_leases,
    reap_expired_leases,
};

use crate::support::{TestDb, claim_one, leases, wait_until};

const MINUTE: Duration = Duration::from_secs(60);
/// The advisory lock the gated finish waits on.
const GATE: i64 = 4949;

/// The locking read's probe, as `finish_jobs.sql` has it.
const PROBE: &str =
    "    WHERE j.id = ANY($1)\n      AND j.status = 'processing'\n    -- FOR UPDATE";

/// `finish_jobs.sql` with its locking read's ids computed behind [`GATE`]:
/// the statement has its snapshot, and has locked nothing yet.
fn gated(file: &'static str, text: &'static str) -> String {
    if file != "finish_jobs.sql" {
        return text.to_owned();
    }
    assert!(text.contains(PROBE), "the finish's locking read moved");
    text.replacen(
        PROBE,
        &PROBE.replace(
            "ANY($1)",
            &format!("ANY((SELECT $1 FROM pg_advisory_xact_lock_shared({GATE}))::bigint[])"),
        ),
        1,
    )
}

async fn connect(db: &TestDb) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .expect("a tokio-postgres connection");
    tokio::spawn(connection);
    client
}

fn enqueue(conn: &mut PgConnection, n: i64) {
    diesel::sql_query("INSERT INTO jobs (kind) SELECT 'noop' FROM generate_series(1, $1)")
        .bind::<BigInt, _>(n)
        .execute(conn)
        .expect("enqueue");
}

fn outcome(job: &ClaimedJob, outcome: Outcome) -> Finish {
    Finish {
        job_id: job.id,
        lease_token: job.lease_token,
        outcome,
    }
}

fn retry() -> Outcome {
    Outcome::Retry {
        delay: MINUTE,
        error: "again".to_owned(),
    }
}

fn failed() -> Outcome {
    Outcome::Failed {
        error: "never".to_owned(),
    }
}

fn done() -> Outcome {
    Outcome::Done { local: None }
}

/// `(status, lease_token)` of the job in `jobs_all`, and in how many rows of
/// it the job is (one: never both live and archived).
fn state(conn: &mut PgConnection, id: i64) -> (String, Option<i64>, i64) {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = Text)]
        status: String,
        #[diesel(sql_type = diesel::sql_types::Nullable<BigInt>)]
        lease_token: Option<i64>,
        #[diesel(sql_type = BigInt)]
        copies: i64,
    }
    let row: Row = diesel::sql_query(
        "SELECT min(status) AS status, min(lease_token) AS lease_token, count(*) AS copies \
         FROM jobs_all WHERE id = $1",
    )
    .bind::<BigInt, _>(id)
    .get_result(conn)
    .expect("the job's row");
    (row.status, row.lease_token, row.copies)
}

/// Runs `finishes` through the gated finish, and `meanwhile` once it waits
/// at the gate (its snapshot taken, nothing locked); then lets it go on.
async fn finish_across(
    db: &TestDb,
    finishes: Vec<Finish>,
    meanwhile: impl FnOnce(&mut PgConnection),
) -> FinishReport {
    let client = Arc::new(connect(db).await);
    let statements = HotStatements::prepare_rewritten(&client, gated)
        .await
        .expect("prepare the gated finish");
    let mut gate = db.conn();
    diesel::sql_query(format!("SELECT pg_advisory_lock({GATE})"))
        .execute(&mut gate)
        .expect("close the gate");
    let finishing = {
        let client = Arc::clone(&client);
        tokio::spawn(async move { statements.finish(&client, &finishes).await })
    };
    let mut watch = db.conn();
    wait_until("the finish waiting at the gate", MINUTE, || {
        #[derive(QueryableByName)]
        struct Waiting {
            #[diesel(sql_type = BigInt)]
            n: i64,
        }
        diesel::sql_query(
            "SELECT count(*) AS n FROM pg_locks \
             WHERE locktype = 'advisory' AND NOT granted AND objid = $1 \
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .bind::<BigInt, _>(GATE)
        .get_result::<Waiting>(&mut watch)
        .expect("pg_locks")
        .n > 0
    })
    .await;
    meanwhile(&mut db.conn());
    diesel::sql_query(format!("SELECT pg_advisory_unlock({GATE})"))
        .execute(&mut gate)
        .expect("open the gate");
    finishing
        .await
        .expect("the finish did not panic")
        .expect("the finish")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_committed_under_the_finish_leaves_it_busy_then_applied_once() {
    let db = TestDb::new();
    let mut conn = db.conn();
    enqueue(&mut conn, 3);
    let jobs: Vec<ClaimedJob> = (0..3)
        .map(|_| claim_one(&mut conn, "noop", "w", MINUTE))
        .collect();
    let finishes = vec![
        outcome(&jobs[0], done()),
        outcome(&jobs[1], retry()),
        outcome(&jobs[2], failed()),
    ];
    let ids: Vec<i64> = jobs.iter().map(|j| j.id).collect();

    let report = finish_across(&db, finishes.clone(), |conn| {
        let beat = extend_leases(conn, &leases(&jobs), MINUTE * 2).expect("heartbeat");
        assert_eq!(beat.extended.len(), 3, "{beat:?}");
    })
    .await;
    // The rows the finish locked are the heartbeat's versions, which its
    // snapshot cannot see: nothing written, each claim still held.
    assert_eq!(report.busy, ids, "{report:?}");
    for job in &jobs {
        assert_eq!(
            state(&mut conn, job.id),
            ("processing".to_owned(), Some(job.lease_token), 1)
        );
    }

    // Written again, as the completer does with a busy outcome: applied.
    let statements_client = connect(&db).await;
    let statements = HotStatements::prepare(&statements_client)
        .await
        .expect("prepare");
    let again = statements
        .finish(&statements_client, &finishes)
        .await
        .expect("finish again");
    assert_eq!(again.applied, ids, "{again:?}");
    assert_eq!(
        state(&mut conn, ids[0]),
        ("done".to_owned(), Some(jobs[0].lease_token), 1)
    );
    assert_eq!(state(&mut conn, ids[1]).0, "pending");
    assert_eq!(state(&mut conn, ids[2]).0, "failed");

    // And never twice.
    let late = statements
        .finish(&statements_client, &finishes)
        .await
        .expect("finish a third time");
    assert_eq!(late.lost, ids, "{late:?}");
    assert_eq!(state(&mut conn, ids[0]).2, 1, "archived once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_reaped_and_taken_again_under_the_finish_is_never_written_by_the_zombie() {
    let db = TestDb::new();
    let mut conn = db.conn();
    enqueue(&mut conn, 2);
    let zombies = [
        claim_one(&mut conn, "noop", "zombie", MINUTE),
        claim_one(&mut conn, "noop", "zombie", MINUTE),
    ];
    let finishes = vec![outcome(&zombies[0], done()), outcome(&zombies[1], failed())];

    let mut owners = Vec::new();
    let report = finish_across(&db, finishes, |conn| {
        diesel::sql_query("UPDATE jobs SET lease_expires_at = now() - interval '1 second'")
            .execute(conn)
            .expect("expire the leases");
        reap_expired_leases(conn, &ReapRequest::new(10), |_| Duration::ZERO).expect("reap");
        owners.push(claim_one(conn, "noop", "owner", MINUTE));
        owners.push(claim_one(conn, "noop", "owner", MINUTE));
    })
    .await;
    assert!(report.applied.is_empty(), "{report:?}");
    assert_eq!(report.busy.len() + report.lost.len(), 2, "{report:?}");
    for owner in &owners {
        assert_eq!(
            state(&mut conn, owner.id),
            ("processing".to_owned(), Some(owner.lease_token), 1),
            "the owner's claim is untouched"
        );
    }

    let client = connect(&db).await;
    let statements = HotStatements::prepare(&client).await.expect("prepare");
    let finishes: Vec<Finish> = owners.iter().map(|o| outcome(o, done())).collect();
    let current = statements
        .finish(&client, &finishes)
        .await
        .expect("the owner's finish");
    assert_eq!(current.applied.len(), 2, "{current:?}");
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Noop {}

impl outbox_core::worker::JobArgs for Noop {
    const KIND: &'static str = "noop";
}

/// The dependents' lock (`lock_dependency_parents.sql`) keeps a finish off a
/// parent while a dependent's enqueue is open. This is the window after it:
/// the enqueue commits once the finish has its snapshot but before it locks
/// the parent, so the snapshot cannot see the dependent. The finish must not
/// end the parent then (it answers busy, and the next finish, on a newer
/// snapshot, releases the dependent), or the dependent would wait for a
/// parent that is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependent_committed_under_the_finish_of_its_parent_is_released() {
    use outbox_core::outbox::{Enqueuer, JobOptions};

    let db = TestDb::new();
    let mut conn = db.conn();
    let parent_id = Enqueuer::new()
        .enqueue(&mut conn, &Noop {}, &JobOptions::default())
        .expect("the parent");
    let parent = claim_one(&mut conn, "noop", "w", MINUTE);
    assert_eq!(parent.id, parent_id);
    let finishes = vec![outcome(&parent, done())];

    let mut child = None;
    let report = finish_across(&db, finishes.clone(), |conn| {
        child = Some(
            Enqueuer::new()
                .enqueue(
                    conn,
                    &Noop {},
                    &JobOptions::default().depends_on([parent_id]),
                )
                .expect("the dependent"),
        );
    })
    .await;
    let child = child.expect("enqueued");
    assert_eq!(report.busy, vec![parent_id], "{report:?}");
    assert_eq!(
        state(&mut conn, parent_id),
        ("processing".to_owned(), Some(parent.lease_token), 1)
    );

    let client = connect(&db).await;
    let statements = HotStatements::prepare(&client).await.expect("prepare");
    let again = statements
        .finish(&client, &finishes)
        .await
        .expect("finish again");
    assert_eq!(again.applied, vec![parent_id], "{again:?}");
    assert_eq!(again.released, 1, "{again:?}");
    let waiting: Vec<i64> = outbox_core::schema::jobs::table
        .find(child)
        .select(outbox_core::schema::jobs::waiting_on)
        .first(&mut conn)
        .expect("the dependent");
    assert!(
        waiting.is_empty(),
        "the dependent still waits on {waiting:?}"
    );
}
