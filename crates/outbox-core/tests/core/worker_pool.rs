//! Worker pools running typed workers: exactly once, retries, fencing, wake-ups.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use outbox_core::outbox::{Enqueuer, JobOptions, NewJob, Waker};
use outbox_core::schema::{jobs, jobs_all};
use outbox_core::statements::{
    ClaimedJob, Finish, JobLease, Outcome, ReapRequest, extend_leases, finish_jobs,
    reap_expired_leases,
};
use outbox_core::worker::{EffectError, EffectResult, JobArgs, JobContext, Worker, Workers};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::support::{TestDb, count, listening, settings, spawn_relay, wait_until};

#[derive(Debug, Serialize, Deserialize)]
struct Tally {
    n: i64,
}

impl JobArgs for Tally {
    const KIND: &'static str = "tally";
}

/// Counts each job it performs, by job id.
#[derive(Clone, Default)]
struct Counter(Arc<Mutex<HashMap<i64, u32>>>);

impl Counter {
    fn runs(&self) -> HashMap<i64, u32> {
        self.0.lock().expect("counter").clone()
    }
}

impl Worker<Tally> for Counter {
    async fn work(&self, _args: Tally, ctx: JobContext) -> EffectResult {
        *self.0.lock().expect("counter").entry(ctx.id()).or_default() += 1;
        Ok(None)
    }
}

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_relays_perform_every_job_exactly_once() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let jobs: Vec<NewJob> = (0..300)
        .map(|n| NewJob::for_args(&Tally { n }, &JobOptions::default()).expect("job"))
        .collect();
    let ids = Enqueuer::new()
        .enqueue_many(&mut conn, &jobs)
        .expect("enqueue");
    let counter = Counter::default();

    let relays: Vec<_> = (0..3)
        .map(|i| {
            let workers = Workers::new().register::<Tally, _>(counter.clone());
            let mut settings = settings(&format!("relay-{i}"), &workers);
            settings.concurrency = 4;
            settings.batch_size = 4;
            spawn_relay(&db, settings, workers)
        })
        .collect();
    wait_until("every job done", MINUTE, || count(&mut conn, "done") == 300).await;
    let claimed: Vec<u64> = relays
        .iter()
        .map(|r| outbox_core::worker_pool::PoolStats::get(&r.stats.claimed))
        .collect();
    for relay in relays {
        relay.stop().await;
    }

    let runs = counter.runs();
    assert_eq!(runs.len(), 300, "every job ran");
    assert!(
        ids.iter().all(|id| runs.get(id) == Some(&1)),
        "each job ran once"
    );
    assert_eq!(
        claimed.iter().sum::<u64>(),
        300,
        "claims per relay: {claimed:?}"
    );
}

/// Fails every attempt with a retryable error.
#[derive(Clone, Default)]
struct Flaky(Arc<Mutex<Vec<i32>>>);

impl Worker<Tally> for Flaky {
    async fn work(&self, _args: Tally, ctx: JobContext) -> EffectResult {
        self.0.lock().expect("attempts").push(ctx.attempt());
        Err(EffectError::retryable("the receiver is down"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retryable_error_is_retried_then_fails_after_max_attempts() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let id = Enqueuer::new()
        .enqueue(
            &mut conn,
            &Tally { n: 1 },
            &JobOptions::default().max_attempts(3),
        )
        .expect("enqueue");
    let flaky = Flaky::default();
    let workers = Workers::new().register::<Tally, _>(flaky.clone());

    let relay = spawn_relay(&db, settings("flaky", &workers), workers);
    wait_until("the job failed", MINUTE, || count(&mut conn, "failed") == 1).await;
    relay.stop().await;

    assert_eq!(*flaky.0.lock().expect("attempts"), vec![1, 2, 3]);
    let (attempts, last_error): (i32, Option<String>) = jobs_all::table
        .find(id)
        .select((jobs_all::attempts, jobs_all::last_error))
        .first(&mut conn)
        .expect("the job");
    assert_eq!(attempts, 3);
    let last_error = last_error.expect("a last_error");
    assert!(
        last_error.contains("attempt 3 of 3") && last_error.contains("the receiver is down"),
        "{last_error}"
    );
}

/// One job of kind `Tally`, claimed by `worker_id` for `lease`.
fn claim(conn: &mut PgConnection, worker_id: &str, lease: Duration) -> ClaimedJob {
    crate::support::claim_one(conn, Tally::KIND, worker_id, lease)
}

/// One job enqueued and claimed by `first`, whose lease runs out; the reaper
/// hands it on and `then` claims it. Returns the job's id and both claims.
fn claimed_reaped_and_claimed_again(
    conn: &mut PgConnection,
    first: &str,
    then: &str,
) -> (i64, ClaimedJob, ClaimedJob) {
    let id = Enqueuer::new()
        .enqueue(conn, &Tally { n: 1 }, &JobOptions::default())
        .expect("enqueue");
    let stale = claim(conn, first, Duration::from_millis(1));
    std::thread::sleep(Duration::from_millis(20));
    let reaped =
        reap_expired_leases(conn, &ReapRequest::new(10), |_| Duration::ZERO).expect("reap");
    assert_eq!(reaped.requeued, 1);
    let current = claim(conn, then, Duration::from_secs(60));
    assert_eq!(current.id, id);
    assert_ne!(current.lease_token, stale.lease_token);
    (id, stale, current)
}

#[test]
fn a_zombie_whose_lease_was_reaped_finishes_nothing() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let (id, zombie, heir) = claimed_reaped_and_claimed_again(&mut conn, "zombie", "heir");

    let report = finish_jobs(
        &mut conn,
        &[Finish {
            job_id: id,
            lease_token: zombie.lease_token,
            outcome: Outcome::Done { local: None },
        }],
    )
    .expect("finish");

    assert_eq!(report.lost, vec![id]);
    assert!(report.applied.is_empty());
    let (status, locked_by, token): (String, Option<String>, Option<i64>) = jobs::table
        .find(id)
        .select((jobs::status, jobs::locked_by, jobs::lease_token))
        .first(&mut conn)
        .expect("the job");
    assert_eq!(
        (status.as_str(), locked_by.as_deref(), token),
        ("processing", Some("heir"), Some(heir.lease_token)),
        "the heir's claim is untouched"
    );
}

/// The protocol model's walk found this: one relay's claim is reaped and the
/// same relay claims the job again, so it holds a stale and a current claim of
/// one job. A heartbeat or a finish naming both must answer each by its token.
#[test]
fn a_relay_holding_a_stale_and_a_current_claim_of_one_job_is_told_which_it_holds() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let (id, stale, current) = claimed_reaped_and_claimed_again(&mut conn, "relay-0", "relay-0");
    let leases = [
        JobLease {
            job_id: id,
            lease_token: current.lease_token,
        },
        JobLease {
            job_id: id,
            lease_token: stale.lease_token,
        },
    ];

    let beat = extend_leases(&mut conn, &leases, Duration::from_secs(60)).expect("heartbeat");
    assert_eq!(beat.extended, vec![leases[0]], "{beat:?}");
    assert_eq!(beat.lost, vec![leases[1]], "{beat:?}");

    let finish = |token| Finish {
        job_id: id,
        lease_token: token,
        outcome: Outcome::Done { local: None },
    };
    let report = finish_jobs(
        &mut conn,
        &[finish(stale.lease_token), finish(current.lease_token)],
    )
    .expect("finish");
    assert_eq!(report.applied, vec![id], "{report:?}");
    assert_eq!(report.lost, vec![id], "{report:?}");
}

/// Takes 20 ms a job (too long to claim ahead of), and notes which jobs each claim
/// announced and whether a job had been announced when it started.
#[derive(Clone, Default)]
struct Announced {
    claims: Arc<Mutex<Vec<Vec<i64>>>>,
    unannounced: Arc<Mutex<Vec<i64>>>,
}

impl Worker<Tally> for Announced {
    async fn work(&self, _args: Tally, ctx: JobContext) -> EffectResult {
        let announced = self
            .claims
            .lock()
            .expect("claims")
            .iter()
            .any(|claim| claim.contains(&ctx.id()));
        if !announced {
            self.unannounced.lock().expect("unannounced").push(ctx.id());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(None)
    }

    fn claimed(&self, jobs: &[&ClaimedJob]) {
        let ids = jobs.iter().map(|job| job.id).collect();
        self.claims.lock().expect("claims").push(ids);
    }
}

/// A deep queue of effects that end a little apart frees slots one at a
/// time; each freed slot starting a claim of its own made claims of a job or
/// two, where one claim under way can take every slot freed meanwhile.
/// And each job's worker hears of it with its claim, before it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_queue_of_20ms_effects_is_claimed_in_batches_each_announced_before_its_jobs_start() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let jobs: Vec<NewJob> = (0..1920)
        .map(|n| NewJob::for_args(&Tally { n }, &JobOptions::default()).expect("job"))
        .collect();
    Enqueuer::new()
        .enqueue_many(&mut conn, &jobs)
        .expect("enqueue");
    let worker = Announced::default();
    let workers = Workers::new().register::<Tally, _>(worker.clone());
    let mut settings = settings("relay-batches", &workers);
    settings.concurrency = 64;
    settings.batch_size = 16;
    let relay = spawn_relay(&db, settings, workers);
    wait_until("every job done", MINUTE, || {
        count(&mut conn, "done") == 1920
    })
    .await;
    let stats = Arc::clone(&relay.stats);
    relay.stop().await;

    let claims = worker.claims.lock().expect("claims").clone();
    let announced: usize = claims.iter().map(Vec::len).sum();
    assert_eq!(announced, 1920, "each job announced once");
    assert_eq!(
        *worker.unannounced.lock().expect("unannounced"),
        Vec::<i64>::new(),
        "no job started before its claim was announced"
    );
    let (claimed, statements) = (
        outbox_core::worker_pool::PoolStats::get(&stats.claimed),
        outbox_core::worker_pool::PoolStats::get(&stats.claims),
    );
    assert_eq!(claimed, 1920);
    assert!(
        claimed >= statements * 8,
        "{statements} claims for {claimed} jobs: at least half a batch each on average; sizes {:?}",
        claims.iter().map(Vec::len).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_woken_after_commit_starts_long_before_the_next_poll() {
    let db = TestDb::new();
    let counter = Counter::default();
    let workers = Workers::new().register::<Tally, _>(counter.clone());
    let mut settings = settings("listener", &workers);
    settings.poll_interval = Duration::from_secs(30);
    let relay = spawn_relay(&db, settings, workers);
    let waker = Waker::new();
    let stop_waker = CancellationToken::new();
    let waking = tokio::spawn(waker.clone().run(db.pool(), stop_waker.clone()));
    let enqueuer = Enqueuer::new().wake_after_commit(waker);
    // The relay's first claim (at start) finds nothing; it then waits on LISTEN.
    let mut conn = db.conn();
    wait_until("the relay is listening", MINUTE, || listening(&mut conn)).await;

    let enqueued = Instant::now();
    enqueuer
        .transaction(&mut conn, |conn| {
            enqueuer.enqueue(conn, &Tally { n: 1 }, &JobOptions::default())
        })
        .expect("enqueue");
    wait_until("the job ran", MINUTE, || !counter.runs().is_empty()).await;
    let latency = enqueued.elapsed();
    relay.stop().await;
    stop_waker.cancel();
    waking.await.expect("the waker stops");

    assert!(
        latency < Duration::from_secs(10),
        "woken after {latency:?}; the poll interval is 30s"
    );
}
