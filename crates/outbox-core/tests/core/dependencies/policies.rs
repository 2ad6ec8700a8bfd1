//! Parents that do not end `done`: failed, reaped out of attempts or
//! cancelled, under each policy (`hold`, `run`).

use super::*;

#[test]
fn a_failed_parent_holds_a_hold_dependent_until_it_is_retried_and_done() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let parent = enqueue(&mut conn, 1, &JobOptions::default());
    let child = enqueue(&mut conn, 2, &JobOptions::default().depends_on([parent]));
    let claimed = claim(&mut conn, 10);
    assert_eq!(finish(&mut conn, &claimed[0], failed()), 0);
    assert!(claim(&mut conn, 10).is_empty(), "held by the failed parent");
    assert_eq!(waiting_on(&mut conn, child), vec![parent]);

    let retried = retry_failed_jobs(&mut conn, &RetrySelection::Ids(vec![parent])).expect("retry");
    assert_eq!(retried.retried, vec![parent]);
    let claimed = claim(&mut conn, 10);
    assert_eq!(
        claimed.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![parent]
    );
    assert_eq!(finish(&mut conn, &claimed[0], done()), 1);
    assert_eq!(claim_ids(&mut conn), vec![child]);
}

#[test]
fn a_failed_parent_releases_a_run_dependent_which_is_told_it_did_not_finish() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let ok = enqueue(&mut conn, 1, &JobOptions::default());
    let broken = enqueue(&mut conn, 2, &JobOptions::default());
    let run = JobOptions::default()
        .depends_on([ok, broken])
        .dependency_policy(DependencyPolicy::Run);
    let child = enqueue(&mut conn, 3, &run);
    let parents = claim(&mut conn, 10);
    assert_eq!(
        finish(&mut conn, &parents[1], failed()),
        0,
        "one still runs"
    );
    assert_eq!(waiting_on(&mut conn, child), vec![ok]);
    assert_eq!(finish(&mut conn, &parents[0], done()), 1);
    let claimed = claim(&mut conn, 10);
    assert_eq!(
        claimed.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![child]
    );
    let ctx = JobContext::new(&claimed[0], CancellationToken::new());
    assert_eq!(ctx.unfinished_parents(), &[broken]);

    // Enqueued after its parent failed: not waiting, told at once.
    let after = enqueue(&mut conn, 4, &run);
    let claimed = claim(&mut conn, 10);
    assert_eq!(
        claimed.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![after]
    );
    assert_eq!(claimed[0].unfinished_parents, Some(vec![broken]));
}

#[test]
fn a_reaped_parent_out_of_attempts_releases_its_run_dependents() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let parent = enqueue(&mut conn, 1, &JobOptions::default().max_attempts(1));
    let run = JobOptions::default()
        .depends_on([parent])
        .dependency_policy(DependencyPolicy::Run);
    let child = enqueue(&mut conn, 2, &run);
    let hold = enqueue(&mut conn, 3, &JobOptions::default().depends_on([parent]));
    assert_eq!(claim_ids(&mut conn), vec![parent]);
    diesel::sql_query("UPDATE jobs SET lease_expires_at = now() - interval '1 hour' WHERE id = $1")
        .bind::<diesel::sql_types::BigInt, _>(parent)
        .execute(&mut conn)
        .expect("expire");
    let reaped =
        reap_expired_leases(&mut conn, &ReapRequest::new(10), |_| Duration::ZERO).expect("reap");
    assert_eq!(reaped.failed, 1);
    assert_eq!(claim_ids(&mut conn), vec![child]);
    assert_eq!(waiting_on(&mut conn, hold), vec![parent]);
}

#[test]
fn a_cancelled_parent_cancels_hold_dependents_transitively_and_releases_run_ones() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let parent = enqueue(&mut conn, 1, &JobOptions::default());
    let hold = enqueue(&mut conn, 2, &JobOptions::default().depends_on([parent]));
    let grandchild = enqueue(&mut conn, 3, &JobOptions::default().depends_on([hold]));
    let run = enqueue(
        &mut conn,
        4,
        &JobOptions::default()
            .depends_on([parent])
            .dependency_policy(DependencyPolicy::Run),
    );
    let report = cancel_jobs(&mut conn, &[parent]).expect("cancel");
    assert_eq!(report.cancelled, vec![parent]);
    assert_eq!(report.dependents_cancelled, vec![hold, grandchild]);
    let (hold_status, hold_error) = status(&mut conn, hold);
    assert_eq!(hold_status, "cancelled");
    assert_eq!(
        hold_error.as_deref(),
        Some(format!("parent job {parent} was cancelled").as_str())
    );
    let (grand_status, grand_error) = status(&mut conn, grandchild);
    assert_eq!(grand_status, "cancelled");
    assert_eq!(
        grand_error.as_deref(),
        Some(format!("parent job {hold} was cancelled").as_str())
    );
    let claimed = claim(&mut conn, 10);
    assert_eq!(claimed.iter().map(|j| j.id).collect::<Vec<_>>(), vec![run]);
    assert_eq!(claimed[0].unfinished_parents, Some(vec![parent]));
}
