//! Jobs that wait for other jobs: never claimed while waiting, released by
//! the finish of their last parent, the policies for parents that do not
//! finish `done`, fencing, and the enqueue's refusals.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel::prelude::*;
use outbox_core::driver::{
    ClaimRequest, ClaimedJob, Finish, Outcome, ReapRequest, claim_jobs, finish_jobs,
    reap_expired_leases,
};
use outbox_core::outbox::{
    DependencyError, DependencyPolicy, Enqueuer, JobOptions, NewJob, Parent, RetrySelection,
    cancel_jobs, retry_failed_jobs,
};
use outbox_core::schema::{jobs, jobs_all};
use outbox_core::worker::{EffectResult, JobArgs, JobContext, Worker, Workers};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::support::{TestDb, count, settings, spawn_relay, wait_until};

#[derive(Debug, Serialize, Deserialize)]
struct Step {
    n: i64,
}

impl JobArgs for Step {
    const KIND: &'static str = "step";
}

fn claim(conn: &mut PgConnection, limit: i64) -> Vec<ClaimedJob> {
    let kinds = vec![Step::KIND.to_owned()];
    claim_jobs(
        conn,
        &ClaimRequest {
            worker_id: "test",
            kinds: &kinds,
            limit,
            lease: Duration::from_secs(600),
        },
    )
    .expect("claim")
}

fn claim_ids(conn: &mut PgConnection) -> Vec<i64> {
    let mut ids: Vec<i64> = claim(conn, 100).into_iter().map(|j| j.id).collect();
    ids.sort_unstable();
    ids
}

fn finish(conn: &mut PgConnection, job: &ClaimedJob, outcome: Outcome) -> usize {
    let report = finish_jobs(
        conn,
        &[Finish {
            job_id: job.id,
            lease_token: job.lease_token,
            outcome,
        }],
    )
    .expect("finish");
    assert_eq!(report.applied, vec![job.id], "{report:?}");
    report.released
}

fn done() -> Outcome {
    Outcome::Done { local: None }
}

fn failed() -> Outcome {
    Outcome::Failed {
        error: "the receiver said no".into(),
    }
}

fn enqueue(conn: &mut PgConnection, n: i64, options: &JobOptions) -> i64 {
    Enqueuer::new()
        .enqueue(conn, &Step { n }, options)
        .expect("enqueue")
}

fn waiting_on(conn: &mut PgConnection, id: i64) -> Vec<i64> {
    jobs_all::table
        .find(id)
        .select(jobs_all::waiting_on)
        .first(conn)
        .expect("the job")
}

fn status(conn: &mut PgConnection, id: i64) -> (String, Option<String>) {
    jobs_all::table
        .find(id)
        .select((jobs_all::status, jobs_all::last_error))
        .first(conn)
        .expect("the job")
}

#[test]
fn a_dependent_waits_for_every_parent_and_the_last_ones_finish_releases_it() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let a = enqueue(&mut conn, 1, &JobOptions::default());
    let b = enqueue(&mut conn, 2, &JobOptions::default());
    let child = enqueue(&mut conn, 3, &JobOptions::default().depends_on([a, b]));
    assert_eq!(waiting_on(&mut conn, child), vec![a, b]);
    assert_eq!(
        waiting_on(&mut conn, a),
        Vec::<i64>::new(),
        "empty when none"
    );

    let parents = claim(&mut conn, 10);
    assert_eq!(
        parents.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![a, b],
        "the child is not claimable"
    );
    assert_eq!(finish(&mut conn, &parents[0], done()), 0);
    assert_eq!(waiting_on(&mut conn, child), vec![b]);
    assert!(claim(&mut conn, 10).is_empty(), "one parent left");
    assert_eq!(finish(&mut conn, &parents[1], done()), 1, "released");
    assert_eq!(waiting_on(&mut conn, child), Vec::<i64>::new());
    let claimed = claim(&mut conn, 10);
    assert_eq!(
        claimed.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![child]
    );
    let ctx = JobContext::new(&claimed[0], CancellationToken::new());
    assert!(ctx.unfinished_parents().is_empty());

    // A parent already done when the dependent is enqueued is not waited for.
    let late = enqueue(&mut conn, 4, &JobOptions::default().depends_on([a]));
    assert_eq!(waiting_on(&mut conn, late), Vec::<i64>::new());
    let depends_on: Option<Vec<i64>> = jobs_all::table
        .find(late)
        .select(jobs_all::depends_on)
        .first(&mut conn)
        .expect("the job");
    assert_eq!(depends_on, Some(vec![a]));
}

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

#[test]
fn jobs_of_one_enqueue_can_wait_for_each_other() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let jobs = [
        NewJob::for_args(
            &Step { n: 1 },
            &JobOptions::default().depends_on([Parent::InBatch(1)]),
        )
        .expect("job"),
        NewJob::for_args(&Step { n: 2 }, &JobOptions::default()).expect("job"),
    ];
    let ids = Enqueuer::new()
        .enqueue_many(&mut conn, &jobs)
        .expect("enqueue");
    assert!(ids[0] < ids[1], "ids in enqueue order: {ids:?}");
    assert_eq!(waiting_on(&mut conn, ids[0]), vec![ids[1]]);
    let claimed = claim(&mut conn, 10);
    assert_eq!(
        claimed.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![ids[1]]
    );
    finish(&mut conn, &claimed[0], done());
    assert_eq!(claim_ids(&mut conn), vec![ids[0]]);
}

/// Two parents of each child finish in concurrent transactions: under READ
/// COMMITTED a child must never keep the id of a parent that is done.
#[test]
fn parents_of_one_child_finishing_concurrently_never_leave_it_waiting() {
    const CHILDREN: i64 = 300;
    let db = TestDb::new();
    let mut conn = db.conn();
    let mut new_jobs = Vec::new();
    for n in 0..CHILDREN {
        let i = usize::try_from(n * 3).expect("index");
        new_jobs.push(NewJob::for_args(&Step { n }, &JobOptions::default()).expect("job"));
        new_jobs.push(NewJob::for_args(&Step { n }, &JobOptions::default()).expect("job"));
        new_jobs.push(
            NewJob::for_args(
                &Step { n },
                &JobOptions::default().depends_on([Parent::InBatch(i), Parent::InBatch(i + 1)]),
            )
            .expect("job"),
        );
    }
    Enqueuer::new()
        .enqueue_many(&mut conn, &new_jobs)
        .expect("enqueue");
    let mut parents = claim(&mut conn, 2 * CHILDREN);
    assert_eq!(parents.len() as i64, 2 * CHILDREN, "only the parents");
    // The first parent of every child to one thread, the second to another.
    parents.sort_by_key(|j| j.id);
    let (first, second): (Vec<_>, Vec<_>) = parents
        .into_iter()
        .enumerate()
        .partition(|(i, _)| i % 2 == 0);
    let first: Vec<ClaimedJob> = first.into_iter().map(|(_, j)| j).collect();
    let second: Vec<ClaimedJob> = second.into_iter().map(|(_, j)| j).collect();
    let threads: Vec<_> = [first, second]
        .into_iter()
        .map(|half| {
            let url = db.url.clone();
            std::thread::spawn(move || {
                let mut conn = PgConnection::establish(&url).expect("connect");
                for job in half {
                    let finishes = [Finish {
                        job_id: job.id,
                        lease_token: job.lease_token,
                        outcome: Outcome::Done { local: None },
                    }];
                    // A parent locked by the other thread's statement is
                    // reported busy: write it again, as the completer does.
                    loop {
                        let report = finish_jobs(&mut conn, &finishes).expect("finish");
                        if report.busy.is_empty() {
                            break;
                        }
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("finisher");
    }
    let still_waiting: i64 = jobs::table
        .filter(jobs::waiting_on.ne(Vec::<i64>::new()))
        .count()
        .get_result(&mut conn)
        .expect("count");
    assert_eq!(still_waiting, 0);
    assert_eq!(claim(&mut conn, 2 * CHILDREN).len() as i64, CHILDREN);
}

/// Fails the test (records it) when a child runs before its parent is done.
#[derive(Clone)]
struct Checker {
    url: String,
    violations: Arc<Mutex<Vec<i64>>>,
    runs: Arc<Mutex<Vec<i64>>>,
}

impl Worker<Step> for Checker {
    async fn work(&self, _args: Step, ctx: JobContext) -> EffectResult {
        let url = self.url.clone();
        let id = ctx.id();
        let early = tokio::task::spawn_blocking(move || {
            let mut conn = PgConnection::establish(&url).expect("connect");
            let parents: Option<Vec<i64>> = jobs::table
                .find(id)
                .select(jobs::depends_on)
                .first(&mut conn)
                .expect("own row");
            let parents = parents.unwrap_or_default();
            let done: i64 = jobs_all::table
                .filter(jobs_all::id.eq_any(&parents))
                .filter(jobs_all::status.eq("done"))
                .count()
                .get_result(&mut conn)
                .expect("parents");
            done != parents.len() as i64
        })
        .await
        .expect("check");
        if early {
            self.violations.lock().expect("violations").push(id);
        }
        self.runs.lock().expect("runs").push(id);
        Ok(None)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_job_is_never_claimed_under_three_relays_and_1000_pairs() {
    const PAIRS: usize = 1000;
    let db = TestDb::new();
    let mut conn = db.conn();
    let mut new_jobs = Vec::with_capacity(2 * PAIRS);
    for n in 0..PAIRS {
        new_jobs
            .push(NewJob::for_args(&Step { n: n as i64 }, &JobOptions::default()).expect("job"));
        new_jobs.push(
            NewJob::for_args(
                &Step { n: n as i64 },
                &JobOptions::default().depends_on([Parent::InBatch(2 * n)]),
            )
            .expect("job"),
        );
    }
    Enqueuer::new()
        .enqueue_many(&mut conn, &new_jobs)
        .expect("enqueue");
    let checker = Checker {
        url: db.url.clone(),
        violations: Arc::default(),
        runs: Arc::default(),
    };
    let relays: Vec<_> = (0..3)
        .map(|i| {
            let workers = Workers::new().register::<Step, _>(checker.clone());
            let mut settings = settings(&format!("relay-{i}"), &workers);
            settings.concurrency = 8;
            spawn_relay(&db, settings, workers)
        })
        .collect();
    wait_until("every job done", Duration::from_secs(120), || {
        count(&mut conn, "done") == 2 * PAIRS as i64
    })
    .await;
    for relay in relays {
        relay.stop().await;
    }
    assert_eq!(
        *checker.violations.lock().expect("violations"),
        Vec::<i64>::new(),
        "children that ran before their parent was done"
    );
    let mut runs = checker.runs.lock().expect("runs").clone();
    runs.sort_unstable();
    runs.dedup();
    assert_eq!(runs.len(), 2 * PAIRS, "each job ran");
}

/// One parent with many dependents, half of each policy: the parent's own
/// finish releases every one of them, in that statement, each once. A
/// release that walks its dependents one by one, or compares each with every
/// other, shows here as a finish that takes seconds.
#[test]
fn one_parent_with_10_000_dependents_releases_each_once_in_its_finish() {
    const CHILDREN: usize = 10_000;
    let db = TestDb::new();
    let mut conn = db.conn();
    let parent = enqueue(&mut conn, 0, &JobOptions::default());
    let children: Vec<NewJob> = (0..CHILDREN)
        .map(|i| {
            let policy = if i % 2 == 0 {
                DependencyPolicy::Hold
            } else {
                DependencyPolicy::Run
            };
            let options = JobOptions::default()
                .depends_on([parent])
                .dependency_policy(policy);
            NewJob::for_args(&Step { n: i as i64 + 1 }, &options).expect("job")
        })
        .collect();
    let started = std::time::Instant::now();
    let mut child_ids = Enqueuer::new()
        .enqueue_many(&mut conn, &children)
        .expect("enqueue");
    let enqueue_took = started.elapsed();
    child_ids.sort_unstable();
    assert_eq!(child_ids.len(), CHILDREN);

    let claimed = claim(&mut conn, 100);
    assert_eq!(
        claimed.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![parent],
        "no dependent is claimable before its parent ends"
    );
    let started = std::time::Instant::now();
    let released = finish(&mut conn, &claimed[0], done());
    let finish_took = started.elapsed();
    eprintln!(
        "{CHILDREN} dependents: enqueued in {enqueue_took:?}, released by one finish in \
         {finish_took:?}"
    );
    assert_eq!(released, CHILDREN, "every dependent released by the finish");
    let still_waiting: i64 = jobs::table
        .filter(jobs::waiting_on.ne(Vec::<i64>::new()))
        .count()
        .get_result(&mut conn)
        .expect("count");
    assert_eq!(still_waiting, 0);

    // Each claimable exactly once: claims until one comes back empty.
    let mut seen: Vec<i64> = Vec::with_capacity(CHILDREN);
    loop {
        let batch = claim(&mut conn, 1_000);
        if batch.is_empty() {
            break;
        }
        assert!(
            batch.iter().all(|j| j.unfinished_parents.is_none()),
            "a parent that ended done is no unfinished parent"
        );
        seen.extend(batch.iter().map(|j| j.id));
    }
    seen.sort_unstable();
    assert_eq!(seen, child_ids, "every dependent claimed, each once");
    // Generous for a debug build on a busy machine: what it catches is a
    // release that costs per dependent pair, not a slow moment.
    assert!(
        finish_took < Duration::from_secs(10),
        "one finish took {finish_took:?} to release {CHILDREN} dependents"
    );
}
