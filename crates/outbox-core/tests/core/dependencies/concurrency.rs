//! Parents finishing at once, and relays racing for waiting jobs.

use super::*;

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
