//! The relay end to end in-process: exactly once under concurrency, retries,
//! leases, heartbeats, shutdown and wake-ups.

use crate::support::{enqueue, enqueue_many};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use order_service::effects::{self, EffectError, receipt::ReceiptSettings};
use order_service::outbox::NewJob;
use order_service::outbox_core::statements::{ClaimRequest, claim_jobs};
use order_service::schema::jobs_all;
use order_service::worker_pool::PoolStats;

use crate::support::{
    TestDb, count, executor, init_tracing, spawn_relay, test_settings, wait_until,
};

fn enqueue_noops(conn: &mut PgConnection, n: usize, max_attempts: i32) -> Vec<i64> {
    let batch: Vec<NewJob> = (0..n)
        .map(|i| {
            NewJob::new("noop", serde_json::json!({ "i": i })).with_options(
                &order_service::outbox::JobOptions::default().max_attempts(max_attempts),
            )
        })
        .collect();
    let mut ids = Vec::with_capacity(n);
    for chunk in batch.chunks(1000) {
        ids.extend(enqueue_many(conn, chunk).expect("enqueue"));
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_relays_run_each_of_two_thousand_jobs_exactly_once() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let ids = enqueue_noops(&mut conn, 2000, 8);
    let runs: Arc<Mutex<HashMap<i64, usize>>> = Arc::default();

    let relays: Vec<_> = (0..8)
        .map(|w| {
            let runs = Arc::clone(&runs);
            let mut settings = test_settings(&format!("worker-{w}"), &["noop"]);
            settings.concurrency = 8;
            settings.batch_size = 4;
            spawn_relay(
                &db,
                settings,
                executor(move |job| {
                    *runs.lock().expect("runs").entry(job.id).or_default() += 1;
                    async { Ok(None) }
                }),
            )
        })
        .collect();

    wait_until("all 2000 jobs done", Duration::from_secs(120), || {
        count(&mut conn, "done") == 2000
    })
    .await;
    // Counters are read after the relays stopped: a completer bumps its counter
    // just after its write commits, so "2000 done in the table" can be seen first.
    let stats: Vec<_> = relays.iter().map(|r| Arc::clone(&r.stats)).collect();
    for relay in relays {
        relay.stop().await;
    }
    let per_relay: Vec<u64> = stats.iter().map(|s| PoolStats::get(&s.done)).collect();

    let runs = runs.lock().expect("runs");
    assert_eq!(runs.len(), 2000, "every job ran");
    assert!(runs.values().all(|&n| n == 1), "some job ran twice");
    assert!(ids.iter().all(|id| runs.contains_key(id)));
    assert_eq!(per_relay.iter().sum::<u64>(), 2000);
    assert!(
        per_relay.iter().filter(|&&n| n > 0).count() >= 2,
        "work was shared: {per_relay:?}"
    );
    let attempts: Vec<i32> = jobs_all::table
        .select(jobs_all::attempts)
        .load(&mut conn)
        .expect("attempts");
    assert!(attempts.iter().all(|&a| a == 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retryable_failure_backs_off_with_growing_capped_delays_until_the_last_attempt_fails() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let id = enqueue(
        &mut conn,
        &NewJob::new("noop", serde_json::json!({}))
            .with_options(&order_service::outbox::JobOptions::default().max_attempts(5)),
    )
    .expect("enqueue");
    // Each attempt notes when it started (this process's clock) and, on the
    // database's clock, the job's row as it is then (run_after as the previous
    // failure scheduled it) and the moment just before this attempt fails.
    type Seen = (
        Instant,
        chrono::DateTime<chrono::Utc>,
        chrono::DateTime<chrono::Utc>,
    );
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let mut settings = test_settings("w", &["noop"]);
    settings.poll_interval = Duration::from_millis(10);
    settings.backoff.base = Duration::from_millis(200);
    settings.backoff.max = Duration::from_millis(800);
    let log = Arc::clone(&seen);
    let url = db.url.clone();
    let relay = spawn_relay(
        &db,
        settings,
        executor(move |job| {
            let (log, url) = (Arc::clone(&log), url.clone());
            async move {
                let now = Instant::now();
                let run_after = tokio::task::spawn_blocking(move || {
                    let mut conn = PgConnection::establish(&url).expect("connect");
                    jobs_all::table
                        .find(job.id)
                        .select(jobs_all::run_after)
                        .first::<chrono::DateTime<chrono::Utc>>(&mut conn)
                        .expect("job row")
                })
                .await
                .expect("read row");
                // The failure's time as close to its return as the effect can
                // read it: after the row's read, whose length a loaded machine
                // stretches past any slack.
                let failing_at = chrono::Utc::now();
                log.lock().expect("log").push((now, run_after, failing_at));
                Err(EffectError::retryable("receiver said 503"))
            }
        }),
    );

    wait_until("the job to fail", Duration::from_secs(30), || {
        count(&mut conn, "failed") == 1
    })
    .await;
    relay.stop().await;

    let seen = seen.lock().expect("log");
    assert_eq!(seen.len(), 5, "one run per attempt");
    // Equal jitter: the delay after attempt n lies in [d/2, d) with
    // d = 200ms * 2^(n-1), capped at 800ms.
    let bounds = [(100, 200), (200, 400), (400, 800), (400, 800)];
    for (n, (low, high)) in bounds.iter().enumerate() {
        let (started, _, failed_at) = seen[n];
        let (next_started, scheduled, _) = seen[n + 1];
        // Never early: the next attempt starts no sooner than the delay.
        let gap = next_started - started;
        assert!(
            gap >= Duration::from_millis(*low),
            "attempt {}: started again after {gap:?}",
            n + 1
        );
        // The delay counts from the failure, however long the outcome then
        // waits for the completer; the slack covers the effect's last round
        // trip after it read the clock.
        let delay = (scheduled - failed_at)
            .to_std()
            .expect("run_after after the failure");
        assert!(
            delay >= Duration::from_millis(*low) && delay <= Duration::from_millis(*high + 150),
            "attempt {}: run_after {delay:?} after the failure, expected {low}..{high}ms",
            n + 1
        );
    }
    let (attempts, last_error): (i32, Option<String>) = jobs_all::table
        .find(id)
        .select((jobs_all::attempts, jobs_all::last_error))
        .first(&mut conn)
        .expect("job");
    assert_eq!(attempts, 5);
    let last_error = last_error.expect("last_error set");
    assert!(
        last_error.contains("no attempts left") && last_error.contains("receiver said 503"),
        "{last_error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_error_fails_the_job_after_one_attempt() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let id = enqueue(&mut conn, &NewJob::new("noop", serde_json::json!({}))).expect("enqueue");
    let relay = spawn_relay(
        &db,
        test_settings("w", &["noop"]),
        executor(|_| async { Err(EffectError::permanent("550 5.1.1 mailbox unavailable")) }),
    );

    wait_until("the job to fail", Duration::from_secs(20), || {
        count(&mut conn, "failed") == 1
    })
    .await;
    relay.stop().await;

    let (attempts, last_error): (i32, Option<String>) = jobs_all::table
        .find(id)
        .select((jobs_all::attempts, jobs_all::last_error))
        .first(&mut conn)
        .expect("job");
    assert_eq!(attempts, 1);
    assert!(last_error.is_some_and(|e| e.contains("550 5.1.1")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_that_does_not_decode_fails_its_job_without_hurting_the_worker() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let bad = enqueue(
        &mut conn,
        &NewJob::new("receipt_pdf", serde_json::json!({"order": "x"})),
    )
    .expect("enqueue");
    let unknown = enqueue(&mut conn, &NewJob::new("fax", serde_json::json!({}))).expect("enqueue");
    let good = enqueue(&mut conn, &NewJob::new("noop", serde_json::json!({}))).expect("enqueue");
    let pool = db.pool(4);
    let effects = Arc::new(effects::workers(
        pool,
        None,
        None,
        ReceiptSettings::default(),
    ));
    let relay = spawn_relay(
        &db,
        test_settings("w", &["receipt_pdf", "noop", "fax"]),
        effects,
    );

    wait_until("all jobs finished", Duration::from_secs(20), || {
        count(&mut conn, "failed") == 2 && count(&mut conn, "done") == 1
    })
    .await;
    relay.stop().await;

    let rows: HashMap<i64, (String, Option<String>)> = jobs_all::table
        .select((jobs_all::id, jobs_all::status, jobs_all::last_error))
        .load::<(i64, String, Option<String>)>(&mut conn)
        .expect("jobs")
        .into_iter()
        .map(|(id, s, e)| (id, (s, e)))
        .collect();
    assert!(
        rows[&bad]
            .1
            .as_deref()
            .is_some_and(|e| e.contains("does not decode")),
        "{:?}",
        rows[&bad]
    );
    assert!(
        rows[&unknown]
            .1
            .as_deref()
            .is_some_and(|e| e.contains("unknown job kind")),
        "{:?}",
        rows[&unknown]
    );
    assert_eq!(rows[&good].0, "done");
}

/// Claims up to `limit` noop jobs as worker `crashed`, leased for `lease`,
/// and never renews or finishes them: a worker that died. Returns how many.
fn claim_and_crash(conn: &mut PgConnection, limit: i64, lease: Duration) -> usize {
    let kinds = vec!["noop".to_owned()];
    claim_jobs(
        conn,
        &ClaimRequest {
            worker_id: "crashed",
            kinds: &kinds,
            limit,
            lease,
        },
    )
    .expect("claim")
    .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_workers_job_is_reaped_and_finished_by_another_relay() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let id = enqueue(
        &mut conn,
        &NewJob::new("noop", serde_json::json!({}))
            .with_options(&order_service::outbox::JobOptions::default().max_attempts(3)),
    )
    .expect("enqueue");
    let last = enqueue(
        &mut conn,
        &NewJob::new("noop", serde_json::json!({}))
            .with_options(&order_service::outbox::JobOptions::default().max_attempts(1)),
    )
    .expect("enqueue");
    // A worker claims both with a short lease and dies.
    assert_eq!(claim_and_crash(&mut conn, 2, Duration::from_millis(300)), 2);

    let mut settings = test_settings("survivor", &["noop"]);
    settings.reap_interval = Duration::from_millis(100);
    let relay = spawn_relay(&db, settings, executor(|_| async { Ok(None) }));

    wait_until(
        "the dead worker's jobs to end",
        Duration::from_secs(20),
        || count(&mut conn, "done") == 1 && count(&mut conn, "failed") == 1,
    )
    .await;
    relay.stop().await;

    let (status, attempts, locked_by): (String, i32, Option<String>) = jobs_all::table
        .find(id)
        .select((jobs_all::status, jobs_all::attempts, jobs_all::locked_by))
        .first(&mut conn)
        .expect("job");
    assert_eq!(
        (status.as_str(), attempts, locked_by.as_deref()),
        ("done", 2, Some("survivor"))
    );
    let (status, error): (String, Option<String>) = jobs_all::table
        .find(last)
        .select((jobs_all::status, jobs_all::last_error))
        .first(&mut conn)
        .expect("job");
    assert_eq!(status, "failed");
    assert!(error.is_some_and(|e| e.contains("lease expired") && e.contains("crashed")));
}

/// Every relay reaps, each in a transaction of its own on its own connection:
/// the select's row locks must hold until the same transaction has moved the
/// rows, or two reapers would take one job. Each counts what it selected, so
/// a job taken twice shows as a sum above the jobs that expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_reapers_at_once_take_each_of_fifteen_hundred_expired_leases_exactly_once() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let ids = enqueue_noops(&mut conn, 1500, 8);
    assert_eq!(
        claim_and_crash(&mut conn, 1500, Duration::from_millis(200)),
        1500
    );

    let relays: Vec<_> = (0..3)
        .map(|w| {
            let mut settings = test_settings(&format!("reaper-{w}"), &["noop"]);
            settings.reap_interval = Duration::from_millis(20);
            settings.reap_margin = Duration::ZERO;
            spawn_relay(&db, settings, executor(|_| async { Ok(None) }))
        })
        .collect();
    wait_until("every reaped job done", Duration::from_secs(60), || {
        count(&mut conn, "done") == 1500
    })
    .await;
    let reaped: u64 = relays.iter().map(|r| PoolStats::get(&r.stats.reaped)).sum();
    let by_relay: Vec<u64> = relays
        .iter()
        .map(|r| PoolStats::get(&r.stats.reaped))
        .collect();
    for relay in relays {
        relay.stop().await;
    }

    assert_eq!(reaped, 1500, "reaped by each relay: {by_relay:?}");
    let attempts: Vec<i32> = jobs_all::table
        .filter(jobs_all::id.eq_any(&ids))
        .select(jobs_all::attempts)
        .load(&mut conn)
        .expect("jobs");
    assert_eq!(attempts.len(), 1500);
    assert!(
        attempts.iter().all(|&a| a == 2),
        "one crashed claim and one run each"
    );
}

/// An executor whose every effect counts itself in `runs`, then takes `effect_time`.
fn counted_sleeper(
    runs: &Arc<AtomicUsize>,
    effect_time: Duration,
) -> Arc<dyn order_service::effects::JobHandler> {
    let runs = Arc::clone(runs);
    executor(move |_| {
        runs.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(effect_time).await;
            Ok(None)
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_keeps_a_long_effects_lease_alive() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let id = enqueue(&mut conn, &NewJob::new("noop", serde_json::json!({}))).expect("enqueue");
    let runs = Arc::new(AtomicUsize::new(0));

    // The effect takes five leases' worth of time; the relay's own reaper and a
    // second, idle relay's reaper both run all along.
    let lease = Duration::from_millis(400);
    let mut settings = test_settings("slow", &["noop"]);
    settings = settings.with_lease(lease);
    settings.reap_interval = Duration::from_millis(50);
    let relay = spawn_relay(
        &db,
        settings,
        counted_sleeper(&runs, Duration::from_millis(2000)),
    );
    let mut watcher = test_settings("watcher", &["other"]).with_lease(lease);
    watcher.reap_interval = Duration::from_millis(50);
    let other = spawn_relay(&db, watcher, executor(|_| async { Ok(None) }));

    wait_until("the long job to finish", Duration::from_secs(20), || {
        count(&mut conn, "done") == 1
    })
    .await;
    relay.stop().await;
    other.stop().await;

    assert_eq!(runs.load(Ordering::SeqCst), 1, "the job ran once");
    let attempts: i32 = jobs_all::table
        .find(id)
        .select(jobs_all::attempts)
        .first(&mut conn)
        .expect("job");
    assert_eq!(attempts, 1, "never reaped");
}

/// Heartbeats that never reach the database (an outage longer than the lease)
/// let the lease of a running effect lapse; the relay's own reaper must not
/// requeue a job it is still running, or the effect would run twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relays_own_reaper_spares_the_jobs_it_is_still_running() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let id = enqueue(&mut conn, &NewJob::new("noop", serde_json::json!({}))).expect("enqueue");
    let runs = Arc::new(AtomicUsize::new(0));

    let mut settings = test_settings("outage", &["noop"]).with_lease(Duration::from_millis(300));
    settings.heartbeat_interval = Duration::from_secs(3600);
    settings.reap_interval = Duration::from_millis(50);
    let relay = spawn_relay(
        &db,
        settings,
        counted_sleeper(&runs, Duration::from_millis(1500)),
    );
    // The lease really lapses while the effect runs.
    wait_until("the lease to expire", Duration::from_secs(10), || {
        jobs_all::table
            .find(id)
            .select(jobs_all::lease_expires_at)
            .first::<Option<chrono::DateTime<chrono::Utc>>>(&mut conn)
            .expect("job")
            .is_some_and(|lease| lease < chrono::Utc::now())
    })
    .await;
    wait_until("the job to finish", Duration::from_secs(20), || {
        count(&mut conn, "done") == 1
    })
    .await;
    let reaped = PoolStats::get(&relay.stats.reaped);
    relay.stop().await;

    assert_eq!(runs.load(Ordering::SeqCst), 1, "the effect ran once");
    assert_eq!(reaped, 0, "its own reaper left it alone");
    let attempts: i32 = jobs_all::table
        .find(id)
        .select(jobs_all::attempts)
        .first(&mut conn)
        .expect("job");
    assert_eq!(attempts, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_in_flight_effects_and_leaves_unclaimed_jobs_untouched() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    enqueue_noops(&mut conn, 10, 8);
    let started = Arc::new(AtomicUsize::new(0));
    let mut settings = test_settings("w", &["noop"]);
    settings.concurrency = 3;
    settings.batch_size = 3;
    let relay = spawn_relay(
        &db,
        settings,
        counted_sleeper(&started, Duration::from_millis(600)),
    );

    wait_until("three effects in flight", Duration::from_secs(10), || {
        started.load(Ordering::SeqCst) == 3
    })
    .await;
    relay.stop().await;

    let counts = crate::support::status_counts(&mut conn);
    assert_eq!(
        counts.get("done"),
        Some(&3),
        "in-flight effects finished: {counts:?}"
    );
    assert_eq!(
        counts.get("pending"),
        Some(&7),
        "the rest untouched: {counts:?}"
    );
    assert_eq!(
        counts.get("processing"),
        None,
        "nothing left claimed: {counts:?}"
    );
    let attempts: Vec<i32> = jobs_all::table
        .filter(jobs_all::status.eq("pending"))
        .select(jobs_all::attempts)
        .load(&mut conn)
        .expect("jobs");
    assert!(
        attempts.iter().all(|&a| a == 0),
        "no attempt spent on unstarted jobs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effect_still_running_after_the_grace_period_is_interrupted_and_requeued() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let id = enqueue(&mut conn, &NewJob::new("noop", serde_json::json!({}))).expect("enqueue");
    let started = Arc::new(AtomicUsize::new(0));
    let mut settings = test_settings("w", &["noop"]);
    settings.shutdown_grace = Duration::from_millis(200);
    settings.backoff.base = Duration::from_secs(1);
    let seen = Arc::clone(&started);
    let relay = spawn_relay(
        &db,
        settings,
        executor(move |_| {
            seen.fetch_add(1, Ordering::SeqCst);
            async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(None)
            }
        }),
    );
    wait_until("the effect to start", Duration::from_secs(10), || {
        started.load(Ordering::SeqCst) == 1
    })
    .await;
    let stopping = Instant::now();
    relay.stop().await;
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        stopping.elapsed()
    );

    let (status, attempts, error): (String, i32, Option<String>) = jobs_all::table
        .find(id)
        .select((jobs_all::status, jobs_all::attempts, jobs_all::last_error))
        .first(&mut conn)
        .expect("job");
    assert_eq!((status.as_str(), attempts), ("pending", 1));
    assert!(error.is_some_and(|e| e.contains("interrupted")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notify_wakes_an_idle_relay_long_before_the_poll_interval() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let started: Arc<Mutex<Option<Instant>>> = Arc::default();
    let mut settings = test_settings("w", &["noop"]);
    settings.poll_interval = Duration::from_secs(30);
    let seen = Arc::clone(&started);
    let relay = spawn_relay(
        &db,
        settings,
        executor(move |_| {
            *seen.lock().expect("lock") = Some(Instant::now());
            async { Ok(None) }
        }),
    );
    // Let the relay go idle: its listener connected, and a probe job claimed
    // and finished, so its producer has claimed at least once and waits.
    wait_until("the relay's LISTEN", Duration::from_secs(30), || {
        listeners(&mut conn) == 1
    })
    .await;
    enqueue(&mut conn, &NewJob::new("noop", serde_json::json!({}))).expect("probe");
    wait_until("the probe job done", Duration::from_secs(30), || {
        relay.stats.done.load(Ordering::Relaxed) == 1
    })
    .await;
    *started.lock().expect("lock") = None;

    let enqueued = Instant::now();
    conn.transaction(|conn| enqueue(conn, &NewJob::new("noop", serde_json::json!({}))))
        .expect("enqueue");
    wait_until("the job to start", Duration::from_secs(10), || {
        started.lock().expect("lock").is_some()
    })
    .await;
    let latency = started.lock().expect("lock").expect("started") - enqueued;

    // The batch path (what place_order uses) notifies too, once the relay is
    // idle again: the first job's outcome written.
    wait_until("the first job done", Duration::from_secs(30), || {
        relay.stats.done.load(Ordering::Relaxed) == 2
    })
    .await;
    *started.lock().expect("lock") = None;
    let batch_enqueued = Instant::now();
    conn.transaction(|conn| {
        enqueue_many(
            conn,
            &[
                NewJob::new("other", serde_json::json!({})),
                NewJob::new("noop", serde_json::json!({})),
            ],
        )
    })
    .expect("enqueue_many");
    wait_until("the batch job to start", Duration::from_secs(10), || {
        started.lock().expect("lock").is_some()
    })
    .await;
    let batch_latency = started.lock().expect("lock").expect("started") - batch_enqueued;
    relay.stop().await;

    assert!(
        latency < Duration::from_secs(2),
        "woken after {latency:?}, poll interval is 30s"
    );
    assert!(
        batch_latency < Duration::from_secs(2),
        "woken after {batch_latency:?} by enqueue_many, poll interval is 30s"
    );
}

/// Backends of this database listening for jobs: a relay's listener, once
/// its LISTEN has finished (`idle`): while the statement still runs, a NOTIFY
/// can go unheard.
fn listeners(conn: &mut PgConnection) -> i64 {
    diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
        "(SELECT count(*) FROM pg_stat_activity \
          WHERE datname = current_database() AND state = 'idle' \
            AND query ILIKE 'LISTEN%')",
    ))
    .get_result(conn)
    .expect("pg_stat_activity")
}
