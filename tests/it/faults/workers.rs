//! Relay processes killed, paused, stopped, split by kind, and starved of
//! connections.

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt as _;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use order_service::schema::jobs_all;

use super::{Sinks, jobs_of_kind, metric, place_orders, unfinished, wait_all_terminal};
use crate::support::app::http_client;
use crate::support::http::Answer;
use crate::support::process::{BinProcess, Launch};
use crate::support::{TestDb, count, wait_until};

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_with_effects_in_flight_loses_nothing_and_another_finishes_after_its_lease()
{
    let db = TestDb::new();
    let mut conn = db.conn();
    // The receiver holds the first three calls open: they are in flight when
    // the relay dies. Later calls get a 200.
    let sinks = Sinks::start(
        vec![Answer::Hang(Duration::from_secs(120)); 3],
        Answer::status(200),
    )
    .await;
    place_orders(&mut conn, 3, 8);
    let (mut first, _) =
        BinProcess::start_relay(sinks.relay("kill-a", &db.url).env("WEBHOOK_TIMEOUT", "60s")).await;
    wait_until(
        "three webhooks in flight, the other six jobs done",
        MINUTE,
        || sinks.http.requests().len() == 3 && count(&mut conn, "done") == 6,
    )
    .await;
    let held: Vec<_> = jobs_of_kind(&mut conn, "order_webhook");
    assert!(
        held.iter()
            .all(|j| j.status == "processing" && j.locked_by.as_deref() == Some("kill-a")),
        "{held:?}"
    );

    // The leases as last renewed: with the relay dead, nobody renews them.
    let leases: HashMap<i64, chrono::DateTime<chrono::Utc>> = jobs_all::table
        .filter(jobs_all::kind.eq("order_webhook"))
        .select((jobs_all::id, jobs_all::lease_expires_at))
        .load::<(i64, Option<chrono::DateTime<chrono::Utc>>)>(&mut conn)
        .expect("leases")
        .into_iter()
        .map(|(id, lease)| (id, lease.expect("a processing job has a lease")))
        .collect();
    first.sigkill();
    let status = first.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(status.signal(), Some(9), "killed by SIGKILL");
    let (mut second, _) = BinProcess::start_relay(sinks.relay("kill-b", &db.url)).await;
    wait_all_terminal(&mut conn, MINUTE).await;

    let requests = sinks.http.requests();
    assert_eq!(requests.len(), 6, "each webhook once by each relay");
    for (job_id, expiry) in &leases {
        let key = format!("order-webhook-{job_id}");
        let retried = requests[3..]
            .iter()
            .find(|r| r.header("idempotency-key") == Some(key.as_str()))
            .unwrap_or_else(|| panic!("job {job_id} was not called again"));
        assert!(
            retried.at >= *expiry,
            "job {job_id} was taken over at {} before its lease expired at {expiry}",
            retried.at
        );
    }
    for job in jobs_of_kind(&mut conn, "order_webhook") {
        assert_eq!(job.status, "done", "{job:?}");
        assert_eq!(job.locked_by.as_deref(), Some("kill-b"), "{job:?}");
        assert!(job.attempts >= 2, "{job:?}");
        let reason = job.last_error.unwrap_or_default();
        assert!(
            reason.contains("lease expired") && reason.contains("kill-a"),
            "{reason}"
        );
    }
    assert!(second.stderr().contains("reaped expired leases"));
    second.terminate().await;
    let summary = sinks.check(&mut conn);
    assert_eq!((summary.done, summary.failed), (9, 0));
    assert_eq!(summary.repeated_webhooks, 3);
}

#[derive(Debug, PartialEq, Queryable)]
struct FullJob {
    status: String,
    attempts: i32,
    locked_by: Option<String>,
    run_after: chrono::DateTime<chrono::Utc>,
    finished_at: Option<chrono::DateTime<chrono::Utc>>,
    last_error: Option<String>,
}

fn full_job(conn: &mut PgConnection, id: i64) -> FullJob {
    jobs_all::table
        .find(id)
        .select((
            jobs_all::status,
            jobs_all::attempts,
            jobs_all::locked_by,
            jobs_all::run_after,
            jobs_all::finished_at,
            jobs_all::last_error,
        ))
        .first(conn)
        .expect("job")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_paused_past_its_lease_changes_nothing_when_it_resumes() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let sinks = Sinks::start(
        [Answer::Hang(Duration::from_secs(120))],
        Answer::status(200),
    )
    .await;
    place_orders(&mut conn, 1, 8);
    // Its call will time out after 4s: a retry outcome, which would put the
    // job back to pending if it were written.
    let (mut paused, paused_metrics) =
        BinProcess::start_relay(sinks.relay("pause-a", &db.url).env("WEBHOOK_TIMEOUT", "4s")).await;
    wait_until("the webhook in flight, the other jobs done", MINUTE, || {
        sinks.http.requests().len() == 1 && count(&mut conn, "done") == 2
    })
    .await;

    paused.sigstop();
    let (mut other, _) = BinProcess::start_relay(sinks.relay("pause-b", &db.url)).await;
    let webhook = jobs_of_kind(&mut conn, "order_webhook")
        .pop()
        .expect("webhook job")
        .id;
    wait_until("the other relay to finish the job", MINUTE, || {
        let job = full_job(&mut conn, webhook);
        job.status == "done" && job.locked_by.as_deref() == Some("pause-b")
    })
    .await;
    let finished = full_job(&mut conn, webhook);

    paused.sigcont();
    let line = paused.wait_for_line("lease lost", MINUTE).await;
    // Resumed, the relay sees both at once: its call's 4s timeout (a retry
    // outcome, which would put the job back to pending if it were written) and
    // its heartbeat finding the lease gone (which cancels the effect). Either
    // way, nothing may be written.
    let log = paused.stderr();
    assert!(
        log.contains("timed out") || log.contains("the effect was cancelled"),
        "{log}"
    );
    assert!(line.contains(&format!("job_id={webhook}")), "{line}");
    let text = http_client()
        .get(format!("{paused_metrics}/metrics"))
        .send()
        .await
        .expect("scrape the resumed relay")
        .text()
        .await
        .expect("metrics text");
    assert_eq!(
        metric(
            &text,
            "outbox_lease_lost_total",
            &[("kind", "order_webhook")]
        ),
        1.0,
        "{text}"
    );
    // A heartbeat and a reaper round of the resumed relay later, still untouched.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(full_job(&mut conn, webhook), finished);
    assert_eq!(finished.attempts, 2);

    paused.terminate().await;
    other.terminate().await;
    let summary = sinks.check(&mut conn);
    assert_eq!((summary.done, summary.failed), (3, 0));
    assert_eq!(summary.webhook_requests, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_effects_finish_leaves_unstarted_jobs_unspent_and_exits_0() {
    let db = TestDb::new();
    let mut conn = db.conn();
    // A slow receiver: every call is answered 200 after 2s.
    let sinks = Sinks::start([], Answer::Hang(Duration::from_secs(2))).await;
    place_orders(&mut conn, 10, 8);
    let (mut relay, _) = BinProcess::start_relay(
        sinks
            .relay("term-a", &db.url)
            .arg("--kinds")
            .arg("order_webhook")
            .env("RELAY_CONCURRENCY", "3")
            .env("RELAY_BATCH_SIZE", "3"),
    )
    .await;
    wait_until("three calls in flight", MINUTE, || {
        sinks.http.requests().len() >= 3
    })
    .await;
    // In flight: claimed and called. A relay claims ahead of its free slots
    // (the claim's pace), so a `processing` job may not have started yet:
    // those must come back unspent, as unclaimed ones do.
    let called: Vec<String> = sinks
        .http
        .requests()
        .iter()
        .filter_map(|r| r.header("idempotency-key").map(str::to_owned))
        .collect();
    let in_flight: Vec<i64> = jobs_of_kind(&mut conn, "order_webhook")
        .into_iter()
        .filter(|j| j.status == "processing")
        .filter(|j| called.contains(&format!("order-webhook-{}", j.id)))
        .map(|j| j.id)
        .collect();
    assert!(!in_flight.is_empty());

    let asked = Instant::now();
    relay.sigterm();
    let status = relay.wait_exit(Duration::from_secs(30)).await;
    let took = asked.elapsed();
    eprintln!(
        "SIGTERM with {} calls in flight: exit {status} after {took:?}",
        in_flight.len()
    );
    assert_eq!(status.code(), Some(0), "{}", relay.stderr());
    assert!(
        took < Duration::from_secs(10),
        "exited within the grace: {took:?}"
    );
    assert!(relay.stderr().contains("relay stopped"));
    assert!(
        !relay.stderr().contains("interrupting"),
        "{}",
        relay.stderr()
    );

    let calls: HashMap<String, usize> =
        sinks
            .http
            .requests()
            .iter()
            .fold(HashMap::new(), |mut calls, r| {
                *calls
                    .entry(r.header("idempotency-key").unwrap_or_default().to_owned())
                    .or_default() += 1;
                calls
            });
    let webhooks = jobs_of_kind(&mut conn, "order_webhook");
    let mut done = 0;
    for job in &webhooks {
        let key = format!("order-webhook-{}", job.id);
        match job.status.as_str() {
            "done" => {
                done += 1;
                assert_eq!(job.attempts, 1, "{job:?}");
                assert_eq!(calls.get(&key), Some(&1), "{job:?}");
            }
            "pending" => {
                assert!(
                    !in_flight.contains(&job.id),
                    "in flight yet not finished: {job:?}"
                );
                assert_eq!(
                    job.attempts, 0,
                    "an unstarted job spent an attempt: {job:?}"
                );
                assert_eq!(job.locked_by, None, "{job:?}");
                assert!(!calls.contains_key(&key), "{job:?}");
            }
            _ => panic!("after shutdown: {job:?}"),
        }
    }
    assert!(
        done >= in_flight.len() && done < webhooks.len(),
        "{webhooks:?}"
    );
    eprintln!(
        "after SIGTERM: {done} done, {} pending with no attempt spent",
        webhooks.len() - done
    );

    // What is left runs on the next relay, once.
    let (mut next, _) = BinProcess::start_relay(sinks.relay("term-b", &db.url)).await;
    wait_all_terminal(&mut conn, MINUTE).await;
    next.terminate().await;
    let summary = sinks.check(&mut conn);
    assert_eq!((summary.done, summary.failed), (30, 0));
    assert_eq!(summary.repeated_webhooks, 0);
}

#[derive(QueryableByName)]
struct Waiting {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// Statements of `database` that wait for a lock and are a claim.
fn claims_waiting_for_a_lock(conn: &mut PgConnection, database: &str) -> i64 {
    diesel::sql_query(
        "SELECT count(*) AS n FROM pg_stat_activity \
         WHERE datname = $1 AND wait_event_type = 'Lock' AND query LIKE '-- Claims up to%'",
    )
    .bind::<diesel::sql_types::Text, _>(database)
    .get_result::<Waiting>(conn)
    .expect("pg_stat_activity")
    .n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_claim_hands_the_claimed_jobs_back_without_spending_an_attempt() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let sinks = Sinks::start([], Answer::status(200)).await;
    place_orders(&mut conn, 4, 8);
    // Hold the claim statement up: it waits for this lock, and returns its
    // jobs only after the relay was asked to stop.
    let mut locker = db.conn();
    diesel::sql_query("BEGIN")
        .execute(&mut locker)
        .expect("BEGIN");
    diesel::sql_query("LOCK TABLE jobs IN EXCLUSIVE MODE")
        .execute(&mut locker)
        .expect("lock the jobs table");
    let (mut relay, _) = BinProcess::start_relay(sinks.relay("claim-term", &db.url)).await;
    wait_until("a claim waiting for the lock", MINUTE, || {
        claims_waiting_for_a_lock(&mut conn, &db.name) > 0
    })
    .await;
    relay.sigterm();
    relay
        .wait_for_line("shutdown requested", Duration::from_secs(10))
        .await;
    diesel::sql_query("COMMIT")
        .execute(&mut locker)
        .expect("COMMIT");

    let status = relay.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0), "{}", relay.stderr());
    let line = relay
        .wait_for_line(
            "handed back unstarted jobs at shutdown",
            Duration::from_secs(1),
        )
        .await;
    let released: usize = crate::support::process::field(&line, "handed_back")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    // Every job its claims took (how many depends on the claim's pace: one
    // claim in flight at first, its size RELAY_BATCH_SIZE), and below they
    // are all pending with no attempt spent.
    let total = super::load_jobs(&mut conn).len();
    assert!(released > 0 && released <= total, "{line}");
    for job in super::load_jobs(&mut conn) {
        assert_eq!(job.status, "pending", "{job:?}");
        assert_eq!(job.attempts, 0, "{job:?}");
        assert_eq!(job.locked_by, None, "{job:?}");
    }
    assert!(sinks.http.requests().is_empty() && sinks.smtp.mails().is_empty());
    eprintln!("{line}");

    let (mut next, _) = BinProcess::start_relay(sinks.relay("claim-term-b", &db.url)).await;
    wait_all_terminal(&mut conn, MINUTE).await;
    next.terminate().await;
    let summary = sinks.check(&mut conn);
    assert_eq!((summary.done, summary.failed), (12, 0));
    assert!(
        super::load_jobs(&mut conn).iter().all(|j| j.attempts == 1),
        "each job ran once, on its first counted attempt"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_with_different_kinds_on_one_database_each_claim_only_their_own() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let sinks = Sinks::start([], Answer::status(200)).await;
    // Each relay gets only the configuration of its own kind.
    let email = Launch::relay("kinds-email", &db.url)
        .args(&["--kinds", "confirmation_email"])
        .env("SMTP_URL", sinks.smtp.url());
    let receipt = Launch::relay("kinds-receipt", &db.url).args(&["--kinds", "receipt_pdf"]);
    let webhook = Launch::relay("kinds-webhook", &db.url)
        .args(&["--kinds", "order_webhook"])
        .env("WEBHOOK_URL", sinks.http.url().as_str())
        .env("WEBHOOK_SECRET", super::WEBHOOK_SECRET);
    let mut relays = Vec::new();
    for launch in [email, receipt, webhook] {
        relays.push(BinProcess::start_relay(launch).await.0);
    }
    place_orders(&mut conn, 20, 8);
    wait_all_terminal(&mut conn, MINUTE).await;

    let owner = HashMap::from([
        ("confirmation_email", "kinds-email"),
        ("receipt_pdf", "kinds-receipt"),
        ("order_webhook", "kinds-webhook"),
    ]);
    for job in super::load_jobs(&mut conn) {
        assert_eq!(job.status, "done", "{job:?}");
        assert_eq!(
            job.locked_by.as_deref(),
            owner.get(job.kind.as_str()).copied(),
            "{job:?}"
        );
    }
    for relay in &mut relays {
        relay.terminate().await;
    }
    let summary = sinks.check(&mut conn);
    assert_eq!((summary.done, summary.failed), (60, 0));
}

/// A burst's orders: 1,200 jobs, forty times the slots, and every slot past
/// the fourth waiting for a connection all along.
const BURST: usize = 400;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_smaller_than_the_concurrency_drains_a_burst_of_400_orders() {
    // It loads the machine and bounds no time: beside one other such test.
    let _loud = crate::support::seats::loud();
    let db = TestDb::new();
    let mut conn = db.conn();
    let sinks = Sinks::start([], Answer::status(200)).await;
    let (mut relay, _) = BinProcess::start_relay(
        sinks
            .relay("burst", &db.url)
            .env("RELAY_CONCURRENCY", "32")
            .env("RELAY_POOL_SIZE", "4")
            // Leases are not the point here; a loaded machine must not expire them.
            .env("RELAY_LEASE", "30s"),
    )
    .await;
    assert!(relay.stderr().contains("pool_size=4"), "{}", relay.stderr());

    let started = Instant::now();
    place_orders(&mut conn, BURST, 8);
    wait_until("every job done or failed", Duration::from_secs(300), || {
        unfinished(&mut conn) == 0
    })
    .await;
    let took = started.elapsed();
    assert!(relay.is_running());
    relay.terminate().await;

    let jobs = super::load_jobs(&mut conn);
    let retried: Vec<_> = jobs.iter().filter(|j| j.attempts > 1).collect();
    eprintln!(
        "burst of {BURST} orders drained in {took:?}; {} jobs needed more than one attempt",
        retried.len()
    );
    assert!(
        retried.is_empty(),
        "jobs starved of a connection spent attempts: {:?}",
        retried.iter().take(5).collect::<Vec<_>>()
    );
    let summary = sinks.check(&mut conn);
    assert_eq!((summary.done, summary.failed), (BURST * 3, 0));
    assert_eq!(summary.mails, BURST);
    assert_eq!(summary.webhook_requests, BURST);
}
