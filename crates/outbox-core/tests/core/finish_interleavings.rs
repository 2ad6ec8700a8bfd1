//! The finish against writes that commit while it runs. It writes the row
//! version its locking read took, by ctid, under the statement's snapshot; a
//! write committed between that snapshot and the lock (a heartbeat's lease
//! extension, a reap and a new claim) leaves a version the snapshot cannot
//! see. Whatever commits there, an outcome is applied at most once, only
//! under its own claim, and one not applied is answered busy (written again)
//! or lost, never dropped while still held.
//!
//! The standalone finish (a `DELETE` that takes each row's lock itself)
//! rechecks a row changed under it in its newest version instead, and leaves
//! to finish_jobs.sql every claim that recheck refuses.
//!
//! The interleaving is forced: the finish under test is the real statement
//! made to wait on an advisory lock after its snapshot is taken, where it
//! computes the ids its locking read probes.

use std::sync::Arc;
use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use outbox_core::outbox::{Enqueuer, JobOptions};
use outbox_core::statements::{
    ClaimedJob, Finish, FinishReport, HotStatements, Outcome, ReapRequest, extend_leases,
    reap_expired_leases,
};

use crate::support::{TestDb, claim_one, connect, leases, wait_until};

const MINUTE: Duration = Duration::from_secs(60);
/// The advisory lock the gated finish waits on.
const GATE: i64 = 4949;

/// The locking read's probe, as `finish_jobs.sql` has it.
const PROBE: &str =
    "    WHERE j.id = ANY($1)\n      AND j.status = 'processing'\n    -- FOR UPDATE";
/// The same, as `finish_standalone_jobs.sql` has it.
const STANDALONE_PROBE: &str = "    WHERE j.id = ANY ($1)\n      AND j.lease_token = ANY ($2)";

/// The finishing statements with the ids their row locks are taken for
/// computed behind [`GATE`]: the statement has its snapshot, and has locked
/// nothing yet.
fn gated(file: &'static str, text: &'static str) -> String {
    let (probe, ids) = match file {
        "finish_jobs.sql" => (PROBE, "ANY($1)"),
        "finish_standalone_jobs.sql" => (STANDALONE_PROBE, "ANY ($1)"),
        _ => return text.to_owned(),
    };
    assert!(text.contains(probe), "the locking read of {file} moved");
    // The gate is a lock wait: the standalone finish's bound on its waits
    // would end it.
    let text = text.replace(
        "set_config('lock_timeout', '50ms', true)",
        "set_config('lock_timeout', '0', true)",
    );
    text.replacen(
        probe,
        &probe.replace(
            ids,
            &format!("ANY((SELECT $1 FROM pg_advisory_xact_lock_shared({GATE}))::bigint[])"),
        ),
        1,
    )
}

fn enqueue(conn: &mut PgConnection, n: i64) {
    diesel::sql_query("INSERT INTO jobs (kind) SELECT 'noop' FROM generate_series(1, $1)")
        .bind::<BigInt, _>(n)
        .execute(conn)
        .expect("enqueue");
}

/// One `noop` job through the enqueue (which marks it, and any parent of
/// it, for the finish); `parent` makes it that job's dependent.
fn enqueue_noop(conn: &mut PgConnection, parent: Option<i64>) -> i64 {
    let options = match parent {
        Some(parent) => JobOptions::default().depends_on([parent]),
        None => JobOptions::default(),
    };
    Enqueuer::new()
        .enqueue(conn, &Noop {}, &options)
        .expect("enqueue")
}

/// The parents `job` still waits for.
fn waiting_on(conn: &mut PgConnection, job: i64) -> Vec<i64> {
    outbox_core::schema::jobs::table
        .find(job)
        .select(outbox_core::schema::jobs::waiting_on)
        .first(conn)
        .expect("the dependent")
}

/// `child` waits for nothing any more.
fn assert_released(conn: &mut PgConnection, child: i64) {
    let waiting = waiting_on(conn, child);
    assert!(
        waiting.is_empty(),
        "the dependent still waits on {waiting:?}"
    );
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
    finish_across_with(db, finishes, false, meanwhile).await
}

/// [`finish_across`], through the standalone finish first when `standalone`
/// (every claim marked standalone), which then waits at the gate.
async fn finish_across_with(
    db: &TestDb,
    finishes: Vec<Finish>,
    standalone: bool,
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
        tokio::spawn(async move {
            let marks = vec![standalone; finishes.len()];
            statements
                .finish_standalone_first(&client, &finishes, &marks)
                .await
        })
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
    let db = TestDb::new();
    let mut conn = db.conn();
    let parent_id = enqueue_noop(&mut conn, None);
    let parent = claim_one(&mut conn, "noop", "w", MINUTE);
    assert_eq!(parent.id, parent_id);
    let finishes = vec![outcome(&parent, done())];

    let mut child = None;
    let report = finish_across(&db, finishes.clone(), |conn| {
        child = Some(enqueue_noop(conn, Some(parent_id)));
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
    assert_released(&mut conn, child);
}

/// The standalone finish of a parent whose dependent commits under it: the
/// `DELETE` rechecks the mark the enqueue wrote (the row's newest version)
/// and leaves the parent to finish_jobs.sql, which (with a snapshot that
/// sees the dependent) archives it and releases the dependent, in the same
/// call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependent_committed_under_the_standalone_finish_of_its_parent_is_released() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let parent_id = enqueue_noop(&mut conn, None);
    let parent = claim_one(&mut conn, "noop", "w", MINUTE);
    assert!(parent.standalone, "{parent:?}");

    let mut child = None;
    let report = finish_across_with(&db, vec![outcome(&parent, done())], true, |conn| {
        child = Some(enqueue_noop(conn, Some(parent_id)));
    })
    .await;
    let child = child.expect("enqueued");
    assert_eq!(report.applied, vec![parent_id], "{report:?}");
    assert_eq!(report.released, 1, "{report:?}");
    assert_eq!(
        state(&mut conn, parent_id),
        ("done".to_owned(), Some(parent.lease_token), 1)
    );
    assert_released(&mut conn, child);
}

/// The standalone finish under a heartbeat, and under a reap and a new
/// claim: the `DELETE` rechecks each row's newest version; the heartbeat's
/// passes, so that claim is applied once in the same call, and the zombie's
/// token is no row's any more, so its claim goes on to finish_jobs.sql and is
/// answered lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standalone_finish_applies_once_under_a_heartbeat_and_never_for_a_zombie() {
    let db = TestDb::new();
    let mut conn = db.conn();
    for _ in 0..2 {
        enqueue_noop(&mut conn, None);
    }
    let beating = claim_one(&mut conn, "noop", "w", MINUTE);
    let zombie = claim_one(&mut conn, "noop", "w", MINUTE);
    let finishes = vec![outcome(&beating, done()), outcome(&zombie, done())];

    let mut taken = None;
    let report = finish_across_with(&db, finishes, true, |conn| {
        let beat = extend_leases(conn, &leases(std::slice::from_ref(&beating)), MINUTE * 2)
            .expect("heartbeat");
        assert_eq!(beat.extended.len(), 1, "{beat:?}");
        diesel::sql_query(
            "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
        )
        .bind::<BigInt, _>(zombie.id)
        .execute(conn)
        .expect("expire the zombie's lease");
        let reaped =
            reap_expired_leases(conn, &ReapRequest::new(10), |_| Duration::ZERO).expect("reap");
        assert_eq!(reaped.requeued, 1, "{reaped:?}");
        taken = Some(claim_one(conn, "noop", "v", MINUTE));
    })
    .await;
    let taken = taken.expect("claimed again");
    assert_eq!(taken.id, zombie.id);
    assert_eq!(report.applied, vec![beating.id], "{report:?}");
    assert_eq!(report.lost, vec![zombie.id], "{report:?}");
    assert_eq!(
        state(&mut conn, beating.id),
        ("done".to_owned(), Some(beating.lease_token), 1)
    );
    assert_eq!(
        state(&mut conn, zombie.id),
        ("processing".to_owned(), Some(taken.lease_token), 1)
    );
}

/// A standalone job's row held by an open transaction: the standalone
/// finish waits for it no longer than its bound, writes nothing, and the
/// claim goes on to finish_jobs.sql, which answers it busy; written again
/// once the row is free, it is applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_held_past_the_standalone_bound_is_answered_busy_then_applied_once() {
    let db = TestDb::new();
    let mut conn = db.conn();
    enqueue_noop(&mut conn, None);
    let job = claim_one(&mut conn, "noop", "w", MINUTE);
    let finishes = vec![outcome(&job, done())];
    let client = connect(&db).await;
    let statements = HotStatements::prepare(&client).await.expect("prepare");

    let mut holder = db.conn();
    diesel::sql_query("BEGIN")
        .execute(&mut holder)
        .expect("begin");
    diesel::sql_query("SELECT id FROM jobs WHERE id = $1 FOR UPDATE")
        .bind::<BigInt, _>(job.id)
        .execute(&mut holder)
        .expect("hold the row");
    let report = tokio::time::timeout(
        Duration::from_secs(10),
        statements.finish_standalone_first(&client, &finishes, &[true]),
    )
    .await
    .expect("the finish waits no longer than its bound")
    .expect("the finish");
    assert_eq!(report.busy, vec![job.id], "{report:?}");
    assert_eq!(
        state(&mut conn, job.id),
        ("processing".to_owned(), Some(job.lease_token), 1)
    );
    diesel::sql_query("COMMIT")
        .execute(&mut holder)
        .expect("commit");

    let again = statements
        .finish_standalone_first(&client, &finishes, &[true])
        .await
        .expect("finish again");
    assert_eq!(again.applied, vec![job.id], "{again:?}");
    assert_eq!(
        state(&mut conn, job.id),
        ("done".to_owned(), Some(job.lease_token), 1)
    );
}
