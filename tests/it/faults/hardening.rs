//! The long tail: what the outside world sends and what the database does,
//! against a relay that must never freeze, leak a claim or reuse a fence.
//!
//! - hostile bytes from a mail server, a webhook receiver and a custom executor;
//! - an outcome the database refuses, isolated from the rest of its batch;
//! - an effect past its deadline, and an effect whose lease was lost;
//! - two attempts of one job in one relay after an outage;
//! - a heartbeat that meets a row someone else holds locked;
//! - `/livez` for a relay whose claims are refused, and wake-ups at a retry's due time.

use crate::support::{enqueue, enqueue_many};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use order_service::db::{DbError, Failure};
use order_service::effects::EffectError;
use order_service::outbox::NewJob;
use order_service::outbox_core::statements::{
    ClaimRequest, ClaimedJob, ReapRequest, claim_jobs, reap_expired_leases,
};
use order_service::schema::jobs_all;
use order_service::worker_pool::{JobTimeouts, PoolStats};

use super::{Sinks, place_orders, wait_all_terminal};
use crate::support::app::http_client;
use crate::support::http::Answer;
use crate::support::process::BinProcess;
use crate::support::proxy::TcpProxy;
use crate::support::{
    TestDb, count, executor, init_tracing, spawn_relay, test_settings, wait_until,
};

const MINUTE: Duration = Duration::from_secs(60);

/// Sets its flag when dropped: tells whether an effect's future was cancelled.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn job_row(conn: &mut PgConnection, id: i64) -> (String, i32, Option<String>, Option<i64>) {
    jobs_all::table
        .find(id)
        .select((
            jobs_all::status,
            jobs_all::attempts,
            jobs_all::last_error,
            jobs_all::lease_token,
        ))
        .first(conn)
        .expect("job")
}

/// The reproduction: a mail server answered `451 4.3.0 temporary<NUL>failure`,
/// the completer's write failed on the NUL forever, and every later outcome of
/// that relay waited behind it while the heartbeat kept the leases alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bytes_from_a_mail_server_and_a_webhook_receiver_freeze_nothing() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let long = "A".repeat(100_000);
    let sinks = Sinks::start(
        [Answer::status(503).body(format!("bad\0gateway \u{1b}[31m{long}"))],
        Answer::status(200),
    )
    .await;
    let permanent = format!("550 5.7.1 \u{1b}[2Jrejected {long}");
    sinks
        .smtp
        .answer_data_with(["451 4.3.0 temporary\0failure", permanent.as_str()]);
    place_orders(&mut conn, 8, 8);

    // NO_COLOR unset: stderr is a file here, so the log must carry no colour.
    let (mut relay, metrics) =
        BinProcess::start_relay(sinks.relay("hostile", &db.url).without_env("NO_COLOR")).await;
    wait_all_terminal(&mut conn, MINUTE).await;

    let summary = sinks.check(&mut conn);
    assert_eq!(summary.orders, 8);
    assert_eq!(summary.done + summary.failed, 24, "{summary:?}");
    assert!(summary.failed <= 1, "only the 550 may fail: {summary:?}");
    let errors: Vec<(String, String, Option<String>)> = jobs_all::table
        .select((jobs_all::kind, jobs_all::status, jobs_all::last_error))
        .load(&mut conn)
        .expect("jobs");
    assert!(
        errors
            .iter()
            .any(|(kind, status, error)| kind == "confirmation_email"
                && status == "done"
                && error
                    .as_deref()
                    .is_some_and(|e| e.contains("temporary\\0failure"))),
        "the 451 was retried and its reply kept, escaped: {errors:?}"
    );
    for (_, _, error) in &errors {
        let error = error.as_deref().unwrap_or_default();
        assert!(
            !error.contains('\0') && !error.contains('\u{1b}'),
            "{error:?}"
        );
        assert!(error.len() <= order_service::outbox_core::statements::MAX_ERROR_BYTES);
    }
    let live = http_client()
        .get(format!("{metrics}/livez"))
        .send()
        .await
        .expect("GET /livez");
    assert_eq!(live.status(), reqwest::StatusCode::OK);
    relay.terminate().await;
    assert!(
        !relay.stderr().contains('\u{1b}'),
        "no ANSI escape in a log written to a file"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_executors_hostile_errors_are_stored_escaped_and_bounded() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let ids = enqueue_many(
        &mut conn,
        &(0..3)
            .map(|i| {
                NewJob::new("noop", serde_json::json!({ "i": i }))
                    .with_options(&order_service::outbox::JobOptions::default().max_attempts(2))
            })
            .collect::<Vec<_>>(),
    )
    .expect("enqueue");
    let (nul, bidi) = (ids[0], ids[1]);
    let relay = spawn_relay(
        &db,
        test_settings("custom", &["noop"]),
        executor(move |job: ClaimedJob| async move {
            if job.id == nul && job.attempt == 1 {
                Err(EffectError::retryable(format!("\0{}", "x".repeat(100_000))))
            } else if job.id == bidi {
                Err(EffectError::permanent("\u{202e}gnp.exe \r\n\u{7}"))
            } else {
                Ok(None)
            }
        }),
    );
    wait_until("every job finished", MINUTE, || {
        count(&mut conn, "done") == 2 && count(&mut conn, "failed") == 1
    })
    .await;
    relay.stop().await;

    let (_, attempts, error, _) = job_row(&mut conn, nul);
    assert_eq!(attempts, 2);
    let error = error.expect("kept from attempt 1");
    assert!(
        error.contains("\\0xxx") && error.ends_with("more bytes]"),
        "{}",
        &error[..80]
    );
    let (status, _, error, _) = job_row(&mut conn, bidi);
    assert_eq!(status, "failed");
    assert!(
        error.is_some_and(|e| e.ends_with("\\u{202e}gnp.exe \\r\\n\\u{7}")),
        "control characters shown escaped"
    );
}

/// Any refusal other than an outage: the batch is split around the outcome
/// the database refuses, the rest land, and that one is recorded as a failure
/// that says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_the_database_refuses_is_isolated_and_the_rest_of_its_batch_lands() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    // Stands for any deterministic refusal: a constraint, a trigger, a value
    // the server cannot store.
    diesel::sql_query(
        "CREATE FUNCTION refuse_marked() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN \
           IF NEW.status <> 'processing' AND NEW.last_error LIKE '%<marked>%' THEN \
             RAISE EXCEPTION 'trigger says no'; \
           END IF; \
           RETURN NEW; \
         END $$",
    )
    .execute(&mut conn)
    .expect("trigger function");
    diesel::sql_query(
        "CREATE TRIGGER refuse_marked BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION refuse_marked()",
    )
    .execute(&mut conn)
    .expect("trigger");
    let ids = enqueue_many(
        &mut conn,
        &(0..64)
            .map(|i| NewJob::new("noop", serde_json::json!({ "i": i })))
            .collect::<Vec<_>>(),
    )
    .expect("enqueue");
    let marked = ids[17];
    // Effects finish together, so outcomes reach the completer in batches.
    let mut settings = test_settings("isolating", &["noop"]);
    settings.concurrency = 64;
    settings.batch_size = 64;
    let relay = spawn_relay(
        &db,
        settings,
        executor(move |job: ClaimedJob| async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if job.id == marked {
                Err(EffectError::permanent("receiver said <marked>"))
            } else {
                Ok(None)
            }
        }),
    );
    wait_until("63 done and the marked one failed", MINUTE, || {
        count(&mut conn, "done") == 63 && count(&mut conn, "failed") == 1
    })
    .await;
    let stats = Arc::clone(&relay.stats);
    relay.stop().await;

    let (status, attempts, error, _) = job_row(&mut conn, marked);
    assert_eq!((status.as_str(), attempts), ("failed", 1));
    let error = error.expect("a reason");
    assert!(
        error.contains("could not be recorded") && error.contains("trigger says no"),
        "{error}"
    );
    assert_eq!(PoolStats::get(&stats.isolated), 1);
    assert_eq!(PoolStats::get(&stats.done), 63);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effect_past_its_deadline_is_cancelled_and_retried() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let id = enqueue(&mut conn, &NewJob::new("noop", serde_json::json!({}))).expect("enqueue");
    let cancelled = Arc::new(AtomicBool::new(false));
    let mut settings = test_settings("deadline", &["noop"]);
    settings.job_timeouts = JobTimeouts::uniform(Duration::from_secs(60));
    settings
        .job_timeouts
        .per_kind
        .insert("noop".into(), Duration::from_millis(300));
    let flag = Arc::clone(&cancelled);
    let started = Instant::now();
    let relay = spawn_relay(
        &db,
        settings,
        executor(move |job: ClaimedJob| {
            let flag = Arc::clone(&flag);
            async move {
                if job.attempt == 1 {
                    let _guard = DropFlag(flag);
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                Ok(None)
            }
        }),
    );
    wait_until("the job done", MINUTE, || count(&mut conn, "done") == 1).await;
    let stats = Arc::clone(&relay.stats);
    relay.stop().await;

    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(
        cancelled.load(Ordering::SeqCst),
        "the hung effect was dropped"
    );
    assert_eq!(PoolStats::get(&stats.timed_out), 1);
    let (_, attempts, error, _) = job_row(&mut conn, id);
    assert_eq!(attempts, 2);
    assert!(
        error.is_some_and(|e| e.contains("deadline exceeded") && e.contains("300ms")),
        "the first attempt's error names the deadline"
    );
}

/// Takes job `id` from whoever holds it, as a reaper and another relay would:
/// expires its lease, reaps it, and claims it as `thief`.
fn steal(conn: &mut PgConnection, id: i64, thief: &str) -> ClaimedJob {
    // The reap and the thief's claim commit together: requeued and committed
    // alone, the job could be claimed back by the victim's own relay (it
    // still runs) before the thief's claim, and the thief would find nothing.
    conn.transaction(|conn| {
        diesel::sql_query(
            "UPDATE jobs SET lease_expires_at = now() - interval '1 hour' WHERE id = $1 AND status = 'processing'",
        )
        .bind::<diesel::sql_types::BigInt, _>(id)
        .execute(conn)?;
        let reaped = reap_expired_leases(conn, &ReapRequest::new(10), |_| Duration::ZERO)
            .map_err(|e| diesel::result::Error::QueryBuilderError(e.to_string().into()))?;
        assert_eq!(reaped.requeued, 1);
        let kinds = vec!["noop".to_owned()];
        claim_jobs(
            conn,
            &ClaimRequest {
                worker_id: thief,
                kinds: &kinds,
                limit: 1,
                lease: Duration::from_secs(600),
            },
        )
    })
    .expect("reap and claim")
    .pop()
    .expect("the reaped job")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_cancels_the_running_effect_and_its_outcome_is_never_written() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let id = enqueue(&mut conn, &NewJob::new("noop", serde_json::json!({}))).expect("enqueue");
    let cancelled = Arc::new(AtomicBool::new(false));
    let settings = test_settings("victim", &["noop"]).with_lease(Duration::from_millis(900));
    let flag = Arc::clone(&cancelled);
    let relay = spawn_relay(
        &db,
        settings,
        executor(move |_| {
            let flag = Arc::clone(&flag);
            async move {
                let _guard = DropFlag(flag);
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(None)
            }
        }),
    );
    wait_until("the job running", MINUTE, || {
        count(&mut conn, "processing") == 1
    })
    .await;
    let stolen = steal(&mut conn, id, "thief");

    wait_until("the effect cancelled", Duration::from_secs(10), || {
        cancelled.load(Ordering::SeqCst)
    })
    .await;
    let stats = Arc::clone(&relay.stats);
    relay.stop().await;

    assert_eq!(PoolStats::get(&stats.lease_lost), 1);
    assert_eq!(
        PoolStats::get(&stats.done) + PoolStats::get(&stats.retried),
        0
    );
    let (status, attempts, _, token) = job_row(&mut conn, id);
    assert_eq!(
        (status.as_str(), attempts, token),
        ("processing", 2, Some(stolen.lease_token)),
        "the new owner's claim is untouched"
    );
}

/// A relay cut off from the database for longer than its lease can end up
/// holding two attempts of the same job: the old one, still running, and a
/// new claim made after another reaper requeued the job. The old attempt's
/// end must not take the new attempt's heartbeat with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_attempts_of_one_job_in_one_relay_after_an_outage_keep_their_own_leases() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let id = enqueue(&mut conn, &NewJob::new("noop", serde_json::json!({}))).expect("enqueue");
    let target: SocketAddr = {
        let url = url::Url::parse(&db.url).expect("URL");
        let port = url.port().unwrap_or(5432);
        format!("127.0.0.1:{port}").parse().expect("address")
    };
    let proxy = TcpProxy::start(target).await;
    let mut via_proxy = url::Url::parse(&db.url).expect("URL");
    via_proxy.set_host(Some("127.0.0.1")).expect("host");
    via_proxy.set_port(Some(proxy.port())).expect("port");
    let via_proxy = via_proxy.to_string();

    let lease = Duration::from_millis(1200);
    let mut settings = test_settings("cut-off", &["noop"]).with_lease(lease);
    settings.concurrency = 4;
    settings.batch_size = 1;
    let starts: Arc<Mutex<Vec<(i32, i64)>>> = Arc::default();
    let first_cancelled = Arc::new(AtomicBool::new(false));
    let release_second = Arc::new(tokio::sync::Notify::new());
    let (log, flag, release) = (
        Arc::clone(&starts),
        Arc::clone(&first_cancelled),
        Arc::clone(&release_second),
    );
    let pool = order_service::db::build_pool(
        &via_proxy,
        &order_service::db::PoolOptions {
            size: 8,
            checkout_timeout: Duration::from_millis(500),
            ..order_service::db::PoolOptions::default()
        },
    );
    let relay = order_service::worker_pool::WorkerPool::new(
        pool,
        via_proxy.clone(),
        settings,
        executor(move |job: ClaimedJob| {
            log.lock()
                .expect("log")
                .push((job.attempt, job.lease_token));
            let (flag, release) = (Arc::clone(&flag), Arc::clone(&release));
            async move {
                if job.attempt == 1 {
                    let _guard = DropFlag(flag);
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                } else {
                    release.notified().await;
                }
                Ok(None)
            }
        }),
    )
    .expect("relay");
    let stats = relay.stats();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(relay.run_until_stopped(shutdown.clone()));

    wait_until("attempt 1 running", MINUTE, || {
        starts.lock().expect("log").len() == 1
    })
    .await;
    proxy.down().await;
    // Another relay's reaper requeues the job once the lease has lapsed.
    tokio::time::sleep(lease + Duration::from_millis(300)).await;
    let reaped =
        reap_expired_leases(&mut conn, &ReapRequest::new(10), |_| Duration::ZERO).expect("reap");
    assert_eq!(reaped.requeued, 1);
    proxy.up().await;

    wait_until("attempt 2 claimed by the same relay", MINUTE, || {
        starts.lock().expect("log").len() == 2
    })
    .await;
    wait_until("attempt 1 cancelled", Duration::from_secs(10), || {
        first_cancelled.load(Ordering::SeqCst)
    })
    .await;
    // Three leases' worth of time: attempt 2's lease is renewed throughout.
    let second_token = starts.lock().expect("log")[1].1;
    for _ in 0..6 {
        tokio::time::sleep(lease / 2).await;
        let (status, attempts, _, token) = job_row(&mut conn, id);
        assert_eq!(
            (status.as_str(), attempts, token),
            ("processing", 2, Some(second_token)),
            "attempt 2 keeps its lease"
        );
    }
    release_second.notify_one();
    wait_until("the job done", MINUTE, || count(&mut conn, "done") == 1).await;
    shutdown.cancel();
    running.await.expect("task");

    let starts = starts.lock().expect("log").clone();
    assert_eq!(starts.len(), 2, "no third attempt: {starts:?}");
    assert!(starts[0].1 < starts[1].1, "tokens only grow");
    assert_eq!(PoolStats::get(&stats.lease_lost), 1);
    assert_eq!(PoolStats::get(&stats.done), 1);
}

/// An operator's transaction holding one in-flight row locked must not stall
/// the heartbeat's update, and with it every lease of the relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_blocked_by_a_lock_on_one_row_still_renews_every_other_lease() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let ids = enqueue_many(
        &mut conn,
        &(0..3)
            .map(|i| NewJob::new("noop", serde_json::json!({ "i": i })))
            .collect::<Vec<_>>(),
    )
    .expect("enqueue");
    let runs = Arc::new(AtomicUsize::new(0));
    let lease = Duration::from_millis(900);
    let mut settings = test_settings("locked-out", &["noop"]).with_lease(lease);
    settings.concurrency = 3;
    let counter = Arc::clone(&runs);
    let relay = spawn_relay(
        &db,
        settings,
        executor(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
            async {
                tokio::time::sleep(Duration::from_secs(4)).await;
                Ok(None)
            }
        }),
    );
    // Another relay's reaper, ready to take any lease that lapses.
    let mut watcher = test_settings("watcher", &["other"]).with_lease(lease);
    watcher.reap_interval = Duration::from_millis(50);
    let other = spawn_relay(&db, watcher, executor(|_| async { Ok(None) }));
    wait_until("three effects running", MINUTE, || {
        runs.load(Ordering::SeqCst) == 3
    })
    .await;

    let locker_url = db.url.clone();
    let locked = ids[0];
    let holder = std::thread::spawn(move || {
        let mut operator = PgConnection::establish(&locker_url).expect("connect");
        operator
            .transaction(|conn| {
                diesel::sql_query("SELECT id FROM jobs WHERE id = $1 FOR UPDATE")
                    .bind::<diesel::sql_types::BigInt, _>(locked)
                    .execute(conn)?;
                std::thread::sleep(Duration::from_millis(2500));
                diesel::QueryResult::Ok(())
            })
            .expect("the operator's transaction");
    });
    holder.join().expect("the lock holder");

    wait_until("all three done", MINUTE, || count(&mut conn, "done") == 3).await;
    relay.stop().await;
    other.stop().await;
    for id in &ids[1..] {
        let (_, attempts, _, _) = job_row(&mut conn, *id);
        assert_eq!(
            attempts, 1,
            "job {id} kept its lease while another row was locked"
        );
    }
}

/// A relay whose claims the database refuses (here a constraint; in real life
/// a bad migration or a revoked grant) is stuck, though the database answers:
/// `/livez` says so, `/readyz` does not, and both recover with the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn livez_answers_503_for_a_relay_that_cannot_claim_while_readyz_stays_200() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let sinks = Sinks::start([], Answer::status(200)).await;
    diesel::sql_query(
        "ALTER TABLE jobs ADD CONSTRAINT test_no_claims CHECK (status <> 'processing') NOT VALID",
    )
    .execute(&mut conn)
    .expect("constraint");
    place_orders(&mut conn, 1, 8);
    let (mut relay, metrics) = BinProcess::start_relay(
        sinks
            .relay("stuck", &db.url)
            .env("RELAY_STALL_TIMEOUT", "1s"),
    )
    .await;
    let client = http_client();
    let probe = |path: &'static str| {
        let (client, url) = (client.clone(), format!("{metrics}{path}"));
        async move {
            let response = client.get(url).send().await.expect("probe");
            let status = response.status();
            (
                status,
                response.json::<serde_json::Value>().await.expect("JSON"),
            )
        }
    };

    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        let (status, body) = probe("/livez").await;
        if status == reqwest::StatusCode::SERVICE_UNAVAILABLE {
            break body;
        }
        assert!(Instant::now() < deadline, "livez never went 503: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let reason = body["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("producer") && reason.contains("test_no_claims"),
        "{body}"
    );
    assert_eq!(probe("/readyz").await.0, reqwest::StatusCode::OK);

    diesel::sql_query("ALTER TABLE jobs DROP CONSTRAINT test_no_claims")
        .execute(&mut conn)
        .expect("drop the constraint");
    wait_all_terminal(&mut conn, MINUTE).await;
    assert_eq!(probe("/livez").await.0, reqwest::StatusCode::OK);
    relay.terminate().await;
}

/// No NOTIFY announces a retry: without a timer the relay would see it only
/// at its next poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_due_before_the_next_poll_starts_when_it_is_due() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    // Due before the relay starts: its first claim takes it, no NOTIFY needed.
    enqueue(&mut conn, &NewJob::new("noop", serde_json::json!({}))).expect("enqueue");
    let mut settings = test_settings("punctual", &["noop"]);
    settings.poll_interval = Duration::from_secs(30);
    settings.backoff.base = Duration::from_millis(300);
    settings.backoff.max = Duration::from_millis(300);
    let starts: Arc<Mutex<Vec<(Instant, i32, i64)>>> = Arc::default();
    let log = Arc::clone(&starts);
    let relay = spawn_relay(
        &db,
        settings,
        executor(move |job: ClaimedJob| {
            log.lock()
                .expect("log")
                .push((Instant::now(), job.attempt, job.lease_token));
            async move {
                if job.attempt == 1 {
                    Err(EffectError::retryable("503"))
                } else {
                    Ok(None)
                }
            }
        }),
    );
    wait_until("the job done", Duration::from_secs(20), || {
        count(&mut conn, "done") == 1
    })
    .await;
    relay.stop().await;

    let starts = starts.lock().expect("log").clone();
    let attempts: Vec<(i32, i64)> = starts.iter().map(|s| (s.1, s.2)).collect();
    assert_eq!(
        starts.len(),
        2,
        "(attempt, lease token) of each run: {attempts:?}"
    );
    let gap = starts[1].0 - starts[0].0;
    assert!(
        gap >= Duration::from_millis(150) && gap < Duration::from_secs(10),
        "attempt 2 started {gap:?} after attempt 1 (backoff 150-300ms, poll 30s)"
    );
}

/// Errors are told apart by what they mean for a retry.
#[test]
fn database_failures_are_classified_as_unavailable_transient_or_rejected() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let run = |conn: &mut PgConnection, sql: &str| -> DbError {
        diesel::sql_query(sql)
            .execute(conn)
            .map(drop)
            .map_err(DbError::from)
            .expect_err(sql)
    };
    diesel::sql_query("SET statement_timeout = 50")
        .execute(&mut conn)
        .expect("set");
    assert_eq!(
        run(&mut conn, "SELECT pg_sleep(1)").failure(),
        Failure::Transient
    );
    assert_eq!(
        run(&mut conn, "INSERT INTO jobs (kind) VALUES ('')").failure(),
        Failure::Rejected,
        "a check violation"
    );
    assert_eq!(
        DbError::Unavailable("connection refused".into()).failure(),
        Failure::Unavailable
    );
}

/// The relay's pool sets its session timeouts on every connection it opens.
#[test]
fn pooled_sessions_carry_their_statement_lock_and_idle_timeouts() {
    let db = TestDb::new();
    let pool = order_service::db::build_pool(
        &db.url,
        &order_service::db::PoolOptions {
            size: 1,
            statement_timeout: Some(Duration::from_secs(2)),
            lock_timeout: Some(Duration::from_millis(250)),
            idle_in_transaction_timeout: Some(Duration::from_secs(3)),
            ..order_service::db::PoolOptions::default()
        },
    );
    #[derive(QueryableByName)]
    struct Setting {
        #[diesel(sql_type = diesel::sql_types::Text)]
        v: String,
    }
    let mut conn = pool.get().expect("a pooled connection");
    let show = |conn: &mut PgConnection, name: &str| -> String {
        diesel::sql_query("SELECT current_setting($1) AS v")
            .bind::<diesel::sql_types::Text, _>(name)
            .get_result::<Setting>(conn)
            .expect("setting")
            .v
    };
    assert_eq!(show(&mut conn, "statement_timeout"), "2s");
    assert_eq!(show(&mut conn, "lock_timeout"), "250ms");
    assert_eq!(show(&mut conn, "idle_in_transaction_session_timeout"), "3s");
}
