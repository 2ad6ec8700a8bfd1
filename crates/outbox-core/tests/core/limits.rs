//! Concurrency keys: limits on in-flight jobs, a rate and a pause, enforced
//! across relays by the claim; slots given back once by every end of a claim.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use outbox_core::outbox::{
    ConcurrencyLimit, ConcurrencyLimitError, Enqueuer, JobOptions, NewJob, concurrency_state,
    remove_concurrency_limit, set_concurrency_limit,
};
use outbox_core::statements::{
    ClaimRequest, ClaimedJob, Finish, JobLease, Outcome, ReapRequest, claim_jobs, finish_jobs,
    hand_back_jobs, reap_expired_leases,
};
use outbox_core::worker::{EffectResult, JobArgs, JobContext, Worker, Workers};
use serde::{Deserialize, Serialize};

use crate::support::{TestDb, count, settings, spawn_relay, wait_until};

const MINUTE: Duration = Duration::from_secs(60);

#[derive(Debug, Serialize, Deserialize)]
struct Call {
    n: i64,
}

impl JobArgs for Call {
    const KIND: &'static str = "call";
}

/// Records each start, and how many of its keyed jobs run at once.
#[derive(Clone, Default)]
struct Receiver {
    started: Arc<Mutex<Vec<(Instant, i64)>>>,
    running: Arc<AtomicI64>,
    most: Arc<AtomicI64>,
    pause: Duration,
}

impl Worker<Call> for Receiver {
    async fn work(&self, args: Call, _ctx: JobContext) -> EffectResult {
        self.started
            .lock()
            .expect("starts")
            .push((Instant::now(), args.n));
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(self.pause).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        Ok(None)
    }
}

fn enqueue(conn: &mut PgConnection, jobs: impl IntoIterator<Item = (i64, JobOptions)>) {
    let jobs: Vec<NewJob> = jobs
        .into_iter()
        .map(|(n, options)| NewJob::for_args(&Call { n }, &options).expect("job"))
        .collect();
    Enqueuer::new().enqueue_many(conn, &jobs).expect("enqueue");
}

fn keyed(key: &str) -> JobOptions {
    JobOptions::default().concurrency_key(key)
}

/// The key's jobs in `jobs` with `status`.
fn of_key(conn: &mut PgConnection, key: &str, status: &str) -> i64 {
    use outbox_core::schema::jobs;
    jobs::table
        .filter(jobs::concurrency_key.eq(key))
        .filter(jobs::status.eq(status))
        .count()
        .get_result(conn)
        .expect("count")
}

fn in_flight(conn: &mut PgConnection, key: &str) -> i32 {
    concurrency_state(conn, key)
        .expect("key state")
        .expect("the key's row")
        .in_flight
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_with_max_in_flight_2_never_has_more_than_2_processing_across_three_relays() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let limit = ConcurrencyLimit {
        max_in_flight: Some(2),
        ..ConcurrencyLimit::default()
    };
    set_concurrency_limit(&mut conn, "slow", &limit).expect("limit");
    enqueue(&mut conn, (0..30).map(|n| (n, keyed("slow"))));
    enqueue(&mut conn, (100..160).map(|n| (n, JobOptions::default())));
    let receiver = Receiver {
        pause: Duration::from_millis(30),
        ..Receiver::default()
    };
    let slow = Receiver {
        pause: Duration::from_millis(30),
        ..Receiver::default()
    };

    let relays: Vec<_> = (0..3)
        .map(|i| {
            // One worker registry per relay, sharing the keyed jobs' tally.
            let workers = Workers::new().register::<Call, _>(Split {
                keyed: slow.clone(),
                free: receiver.clone(),
            });
            let mut settings = settings(&format!("relay-{i}"), &workers);
            settings.concurrency = 8;
            settings.batch_size = 8;
            spawn_relay(&db, settings, workers)
        })
        .collect();
    let mut most_seen = 0;
    let mut sampler = db.conn();
    wait_until("every job done", MINUTE, || {
        most_seen = most_seen.max(of_key(&mut sampler, "slow", "processing"));
        count(&mut sampler, "done") == 90
    })
    .await;
    for relay in relays {
        relay.stop().await;
    }

    assert!(
        most_seen <= 2,
        "{most_seen} of the key's jobs processing at once"
    );
    let most_running = slow.most.load(Ordering::SeqCst);
    assert!(
        most_running <= 2,
        "{most_running} of the key's effects ran at once"
    );
    assert_eq!(slow.started.lock().expect("starts").len(), 30);
    assert_eq!(receiver.started.lock().expect("starts").len(), 60);
    assert!(
        receiver.most.load(Ordering::SeqCst) > 2,
        "keyless jobs are not held to the key's limit"
    );
    assert_eq!(in_flight(&mut conn, "slow"), 0, "every slot came back");
}

/// Hands jobs below 100 to `keyed`, the rest to `free`.
#[derive(Clone)]
struct Split {
    keyed: Receiver,
    free: Receiver,
}

impl Worker<Call> for Split {
    async fn work(&self, args: Call, ctx: JobContext) -> EffectResult {
        if args.n < 100 {
            self.keyed.work(args, ctx).await
        } else {
            self.free.work(args, ctx).await
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_per_second_limit_holds_over_seconds_with_two_relays() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let limit = ConcurrencyLimit {
        per_second: Some(5.0),
        ..ConcurrencyLimit::default()
    };
    set_concurrency_limit(&mut conn, "api", &limit).expect("limit");
    enqueue(&mut conn, (0..100).map(|n| (n, keyed("api"))));
    let receiver = Receiver::default();
    let relays: Vec<_> = (0..2)
        .map(|i| {
            let workers = Workers::new().register::<Call, _>(receiver.clone());
            let mut settings = settings(&format!("relay-{i}"), &workers);
            settings.poll_interval = Duration::from_secs(1);
            spawn_relay(&db, settings, workers)
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(4)).await;
    for relay in relays {
        relay.stop().await;
    }

    let starts: Vec<Instant> = receiver
        .started
        .lock()
        .expect("starts")
        .iter()
        .map(|(at, _)| *at)
        .collect();
    let most = starts
        .iter()
        .enumerate()
        .map(|(i, first)| {
            starts[i..]
                .iter()
                .filter(|at| at.duration_since(*first) < Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap_or(0);
    println!(
        "{} calls in 4 s, at most {most} within a second",
        starts.len()
    );
    // A bucket of one token at 5 a second: any window of one second sees at
    // most 5 claims plus the one the bucket held.
    assert!(most <= 6, "{most} calls within a second: {starts:?}");
    assert!(
        (8..=22).contains(&starts.len()),
        "{} calls in 4 s at 5 a second",
        starts.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_keys_jobs_stay_pending_then_run_in_order_once_the_pause_is_lifted() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let paused = ConcurrencyLimit {
        paused_until: Some(chrono::DateTime::<Utc>::MAX_UTC),
        ..ConcurrencyLimit::default()
    };
    set_concurrency_limit(&mut conn, "partner", &paused).expect("pause");
    enqueue(
        &mut conn,
        (0..5).map(|n| (n, keyed("partner").ordering_key("partner:batch-1"))),
    );
    enqueue(&mut conn, (100..110).map(|n| (n, JobOptions::default())));
    let receiver = Receiver::default();
    let workers = Workers::new().register::<Call, _>(receiver.clone());
    let relay = spawn_relay(&db, settings("relay", &workers), workers);

    wait_until("the keyless jobs done", MINUTE, || {
        count(&mut conn, "done") == 10
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        of_key(&mut conn, "partner", "pending"),
        5,
        "the paused key's jobs wait"
    );
    assert_eq!(in_flight(&mut conn, "partner"), 0);

    set_concurrency_limit(&mut conn, "partner", &ConcurrencyLimit::default()).expect("resume");
    wait_until("the key's jobs done", MINUTE, || {
        count(&mut conn, "done") == 15
    })
    .await;
    relay.stop().await;

    let keyed: Vec<i64> = receiver
        .started
        .lock()
        .expect("starts")
        .iter()
        .map(|(_, n)| *n)
        .filter(|n| *n < 100)
        .collect();
    assert_eq!(keyed, vec![0, 1, 2, 3, 4], "in enqueue order");
}

fn claim(conn: &mut PgConnection, worker_id: &str, lease: Duration) -> Vec<ClaimedJob> {
    let kinds = vec![Call::KIND.to_owned()];
    claim_jobs(
        conn,
        &ClaimRequest {
            worker_id,
            kinds: &kinds,
            limit: 10,
            lease,
        },
    )
    .expect("claim")
}

#[test]
fn a_reaped_zombies_slot_comes_back_once_and_its_late_finish_frees_nothing() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let one = ConcurrencyLimit {
        max_in_flight: Some(1),
        ..ConcurrencyLimit::default()
    };
    set_concurrency_limit(&mut conn, "k", &one).expect("limit");
    enqueue(&mut conn, (0..2).map(|n| (n, keyed("k"))));

    let zombie = claim(&mut conn, "zombie", Duration::from_millis(1));
    assert_eq!(zombie.len(), 1, "one slot: one job");
    assert_eq!(in_flight(&mut conn, "k"), 1);
    std::thread::sleep(Duration::from_millis(20));
    let reaped =
        reap_expired_leases(&mut conn, &ReapRequest::new(10), |_| Duration::ZERO).expect("reap");
    assert_eq!(reaped.requeued, 1);
    assert_eq!(
        in_flight(&mut conn, "k"),
        0,
        "the reaper gave the slot back"
    );

    let heir = claim(&mut conn, "heir", Duration::from_secs(60));
    assert_eq!(heir.len(), 1);
    assert_eq!(in_flight(&mut conn, "k"), 1);
    let late = finish_jobs(
        &mut conn,
        &[Finish {
            job_id: zombie[0].id,
            lease_token: zombie[0].lease_token,
            outcome: Outcome::Done { local: None },
        }],
    )
    .expect("finish");
    assert_eq!(late.lost, vec![zombie[0].id]);
    assert_eq!(in_flight(&mut conn, "k"), 1, "the zombie freed nothing");
    assert!(
        claim(&mut conn, "other", Duration::from_secs(60)).is_empty(),
        "saturated"
    );

    let done = finish_jobs(
        &mut conn,
        &[Finish {
            job_id: heir[0].id,
            lease_token: heir[0].lease_token,
            outcome: Outcome::Done { local: None },
        }],
    )
    .expect("finish");
    assert_eq!(done.applied, vec![heir[0].id]);
    assert_eq!(in_flight(&mut conn, "k"), 0);

    // A release at shutdown gives the slot back too, once.
    let next = claim(&mut conn, "leaving", Duration::from_secs(60));
    assert_eq!(next.len(), 1);
    let leases = [JobLease {
        job_id: next[0].id,
        lease_token: next[0].lease_token,
    }];
    assert_eq!(
        hand_back_jobs(&mut conn, &leases).expect("release").len(),
        1
    );
    assert!(
        hand_back_jobs(&mut conn, &leases)
            .expect("release")
            .is_empty()
    );
    assert_eq!(in_flight(&mut conn, "k"), 0);
}

#[test]
fn a_removed_limit_frees_the_key_and_bad_limits_are_refused() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let bad = ConcurrencyLimit {
        max_in_flight: Some(0),
        ..ConcurrencyLimit::default()
    };
    assert!(matches!(
        set_concurrency_limit(&mut conn, "k", &bad),
        Err(ConcurrencyLimitError::MaxInFlight(0))
    ));
    let bad = ConcurrencyLimit {
        per_second: Some(f64::NAN),
        ..ConcurrencyLimit::default()
    };
    assert!(matches!(
        set_concurrency_limit(&mut conn, "k", &bad),
        Err(ConcurrencyLimitError::PerSecond(_))
    ));
    assert_eq!(
        concurrency_state(&mut conn, "k").expect("state"),
        None,
        "nothing written"
    );

    let paused = ConcurrencyLimit {
        paused_until: Some(Utc::now() + chrono::Duration::hours(1)),
        ..ConcurrencyLimit::default()
    };
    set_concurrency_limit(&mut conn, "k", &paused).expect("pause");
    enqueue(&mut conn, (0..3).map(|n| (n, keyed("k"))));
    assert!(claim(&mut conn, "w", Duration::from_secs(60)).is_empty());
    remove_concurrency_limit(&mut conn, "k").expect("remove");
    assert_eq!(claim(&mut conn, "w", Duration::from_secs(60)).len(), 3);
    assert_eq!(in_flight(&mut conn, "k"), 3);
}

/// The claim's plan over 100,000 pending jobs, 99,000 of them on 100 saturated
/// keys: the saturated keys' jobs are never read.
#[test]
fn the_claim_reads_no_job_of_a_saturated_key() {
    let db = TestDb::new();
    let mut conn = db.conn();
    diesel::sql_query(
        "INSERT INTO job_concurrency_keys (key, max_in_flight, in_flight)
         SELECT 'key-' || k, 1, 1 FROM generate_series(1, 100) AS k",
    )
    .execute(&mut conn)
    .expect("keys");
    diesel::sql_query(
        "INSERT INTO jobs (kind, concurrency_key, run_after)
         SELECT 'call', CASE WHEN g <= 99000 THEN 'key-' || (g % 100 + 1) END,
                now() - interval '1 hour' + g * interval '1 ms'
         FROM generate_series(1, 100000) AS g",
    )
    .execute(&mut conn)
    .expect("jobs");
    diesel::sql_query("ANALYZE jobs")
        .execute(&mut conn)
        .expect("analyze");

    #[derive(QueryableByName)]
    struct Plan {
        #[diesel(sql_type = Text, column_name = "QUERY PLAN")]
        plan: String,
    }
    let explain = format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) {}",
        include_str!("../../src/outbox/sql/claim_jobs.sql")
    );
    // The claim takes 16 keyless jobs; the database is this test's alone.
    let plan = diesel::sql_query(&explain)
        .bind::<BigInt, _>(16)
        .bind::<diesel::sql_types::Array<Text>, _>(vec![Call::KIND.to_owned()])
        .bind::<Text, _>("explain")
        .bind::<BigInt, _>(60_000)
        .bind::<diesel::sql_types::Nullable<diesel::sql_types::Timestamptz>, _>(
            None::<chrono::DateTime<Utc>>,
        )
        .bind::<BigInt, _>(0)
        .get_result::<Plan>(&mut conn)
        .expect("explain")
        .plan;

    let plan: serde_json::Value = serde_json::from_str(&plan).expect("json plan");
    let mut read = 0.0;
    walk(&plan[0]["Plan"], &mut |node| {
        if node["Relation Name"] == "jobs" {
            let loops = node["Actual Loops"].as_f64().unwrap_or(1.0);
            read += (node["Actual Rows"].as_f64().unwrap_or(0.0)
                + node["Rows Removed by Filter"].as_f64().unwrap_or(0.0))
                * loops;
        }
    });
    println!("the claim read {read} job rows");
    assert!(read <= 64.0, "the claim read {read} job rows: {plan:#}");
}

fn walk(node: &serde_json::Value, visit: &mut impl FnMut(&serde_json::Value)) {
    visit(node);
    if let Some(children) = node["Plans"].as_array() {
        for child in children {
            walk(child, visit);
        }
    }
}
