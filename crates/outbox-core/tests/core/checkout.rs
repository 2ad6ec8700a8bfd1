//! A checkout per call: pinged for work that must not run twice, not pinged
//! for work that may, and in both cases no call fails on a connection that
//! died while idle in the pool.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use diesel::prelude::*;
use diesel::sql_types::Integer;
use outbox_core::db::{DbError, PgPool, run_blocking_pinged, run_blocking_retried};

use crate::support::TestDb;

#[derive(QueryableByName)]
struct Pid {
    #[diesel(sql_type = Integer)]
    pid: i32,
}

fn backend_pid(conn: &mut PgConnection) -> Result<i32, DbError> {
    Ok(diesel::sql_query("SELECT pg_backend_pid() AS pid")
        .get_result::<Pid>(conn)?
        .pid)
}

/// Fills `pool` with `n` idle connections, then terminates their backends
/// and waits until each has exited, so every pooled connection is dead.
async fn pool_of_dead_connections(db: &TestDb, pool: &PgPool, n: usize) -> Vec<i32> {
    let held: Vec<_> = (0..n).map(|_| pool.get().expect("a connection")).collect();
    let mut pids = Vec::new();
    for mut conn in held {
        pids.push(backend_pid(&mut conn).expect("its pid"));
    }
    let mut admin = db.conn();
    for pid in &pids {
        let gone: bool = diesel::select(diesel::dsl::sql::<diesel::sql_types::Bool>(&format!(
            "pg_terminate_backend({pid}, 5000)"
        )))
        .get_result(&mut admin)
        .expect("terminate");
        assert!(gone, "backend {pid} did not exit");
    }
    assert_eq!(pool.state().idle_connections as usize, n);
    pids
}

/// Runs `backend_pid` pinged or retried, counting its runs in `calls`;
/// its pid once it ran.
async fn run_counted(pool: &PgPool, retried: bool, calls: &Arc<AtomicUsize>) -> i32 {
    let calls = Arc::clone(calls);
    let work = move |conn: &mut PgConnection| {
        calls.fetch_add(1, Ordering::SeqCst);
        backend_pid(conn)
    };
    let outcome = if retried {
        run_blocking_retried(pool, DbError::is_unavailable, work).await
    } else {
        run_blocking_pinged(pool, work).await
    };
    outcome.expect("checked out").expect("ran")
}

#[tokio::test]
async fn a_pinged_call_never_runs_its_work_on_a_dead_connection() {
    let db = TestDb::new();
    let pool = db.pool();
    let dead = pool_of_dead_connections(&db, &pool, 3).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let pid = run_counted(&pool, false, &calls).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the work ran once");
    assert!(!dead.contains(&pid), "ran on a live connection");
}

#[tokio::test]
async fn a_retried_call_runs_again_on_another_connection_when_its_own_had_died() {
    let db = TestDb::new();
    let pool = db.pool();
    let dead = pool_of_dead_connections(&db, &pool, 3).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let pid = run_counted(&pool, true, &calls).await;
    // Unpinged, the first run met a dead connection; the second ran on a
    // pinged one, which skipped the other dead ones.
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert!(!dead.contains(&pid));
    // The dead connections are gone from the pool, not handed out again.
    let again = Arc::new(AtomicUsize::new(0));
    run_counted(&pool, true, &again).await;
    assert_eq!(again.load(Ordering::SeqCst), 1, "no dead connection left");
}

#[tokio::test]
async fn a_retried_call_on_a_live_connection_runs_once_and_keeps_its_error() {
    let db = TestDb::new();
    let pool = db.pool();
    let calls = Arc::new(AtomicUsize::new(0));
    let pid = run_counted(&pool, true, &calls).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // A statement's own failure, even one the caller would take for the
    // connection's, is not run again when the connection still answers.
    let failed = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&failed);
    let outcome = run_blocking_retried(
        &pool,
        |_: &DbError| true,
        move |conn| {
            seen.fetch_add(1, Ordering::SeqCst);
            diesel::sql_query("SELECT 1 / 0")
                .execute(conn)
                .map_err(DbError::from)
        },
    )
    .await
    .expect("checked out");
    assert!(
        outcome.is_err(),
        "division by zero is the statement's error"
    );
    assert_eq!(failed.load(Ordering::SeqCst), 1, "not run again");

    // The connection stays pooled and usable.
    let next = run_counted(&pool, false, &calls).await;
    assert_eq!(next, pid, "the one pooled connection, reused");
}
