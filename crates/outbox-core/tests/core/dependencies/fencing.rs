//! A zombie's late finish of a parent releases nothing, and the enqueue
//! refuses a missing or cancelled parent, or a cycle, writing nothing.

use super::*;

#[test]
fn a_zombies_late_finish_releases_nothing() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let parent = enqueue(&mut conn, 1, &JobOptions::default());
    let child = enqueue(&mut conn, 2, &JobOptions::default().depends_on([parent]));
    let zombie = claim(&mut conn, 10).remove(0);
    diesel::sql_query("UPDATE jobs SET lease_expires_at = now() - interval '1 hour' WHERE id = $1")
        .bind::<diesel::sql_types::BigInt, _>(parent)
        .execute(&mut conn)
        .expect("expire");
    reap_expired_leases(&mut conn, &ReapRequest::new(10), |_| Duration::ZERO).expect("reap");
    let owner = claim(&mut conn, 10).remove(0);
    assert_eq!(owner.id, parent);

    let report = finish_jobs(
        &mut conn,
        &[Finish {
            job_id: zombie.id,
            lease_token: zombie.lease_token,
            outcome: done(),
        }],
    )
    .expect("late finish");
    assert_eq!(report.lost, vec![parent]);
    assert_eq!(report.released, 0);
    assert_eq!(waiting_on(&mut conn, child), vec![parent], "still waiting");
    assert!(claim(&mut conn, 10).is_empty());
    assert_eq!(finish(&mut conn, &owner, done()), 1);
    assert_eq!(claim_ids(&mut conn), vec![child]);
}

#[test]
fn a_missing_or_cancelled_parent_or_a_cycle_is_an_error_and_writes_nothing() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let cancelled = enqueue(&mut conn, 1, &JobOptions::default());
    cancel_jobs(&mut conn, &[cancelled]).expect("cancel");
    let before: i64 = jobs_all::table
        .count()
        .get_result(&mut conn)
        .expect("count");
    let enqueuer = Enqueuer::new();

    let error = enqueuer
        .enqueue(
            &mut conn,
            &Step { n: 2 },
            &JobOptions::default().depends_on([9_999_999]),
        )
        .expect_err("no such parent");
    assert_eq!(
        DependencyError::of(&error),
        Some(&DependencyError::MissingParent(9_999_999))
    );
    let error = enqueuer
        .enqueue(
            &mut conn,
            &Step { n: 3 },
            &JobOptions::default().depends_on([cancelled]),
        )
        .expect_err("cancelled parent");
    assert_eq!(
        DependencyError::of(&error),
        Some(&DependencyError::CancelledParent(cancelled))
    );
    let first = NewJob::for_args(
        &Step { n: 4 },
        &JobOptions::default().depends_on([Parent::InBatch(1)]),
    )
    .expect("job");
    let second = NewJob::for_args(
        &Step { n: 5 },
        &JobOptions::default().depends_on([Parent::InBatch(0)]),
    )
    .expect("job");
    let error = conn
        .transaction(|conn| enqueuer.enqueue_many(conn, &[first, second]))
        .expect_err("cycle");
    assert_eq!(
        DependencyError::of(&error),
        Some(&DependencyError::Cycle(vec![0, 1]))
    );
    let after: i64 = jobs_all::table
        .count()
        .get_result(&mut conn)
        .expect("count");
    assert_eq!(before, after, "nothing written");
    let keys: i64 = diesel::sql_query("SELECT 1 FROM job_concurrency_keys")
        .execute(&mut conn)
        .expect("keys") as i64;
    assert_eq!(keys, 0);
}
