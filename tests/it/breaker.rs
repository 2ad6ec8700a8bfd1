//! The endpoint breaker against real HTTP receivers: a receiver down for a few
//! seconds or refusing some deliveries is left to each delivery's own backoff;
//! only one that has failed every call for `ENDPOINT_TRIP_AFTER` is probed,
//! one delivery at a time, and the first success restores it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use order_service::effects::receipt::ReceiptSettings;
use order_service::effects::webhook::{WebhookConfig, WebhookSender};
use order_service::effects::{self, JobHandler};
use order_service::endpoints::breaker::Breaker;
use order_service::orders::{NewOrder, endpoint_key, order_enqueuer, place_order};
use order_service::outbox::concurrency_state;
use order_service::schema::{delivery_attempts, jobs_all};
use order_service::worker_pool::BackoffPolicy;

use crate::endpoint_delivery::add_endpoint;
use crate::support::http::{Answer, HttpSink};
use crate::support::{
    RunningRelay, TestDb, init_tracing, order_json, spawn_relay, test_settings, transition,
    wait_until,
};

/// The deliveries' own backoff in these tests: the first retry after 0.1 to
/// 0.2 s (a receiver told "retry in 0.2 s"), none later than 0.5 s.
const BACKOFF: BackoffPolicy = BackoffPolicy {
    base: Duration::from_millis(200),
    max: Duration::from_millis(500),
};
/// Scheduling slack on top of a backoff: the relay's poll interval (0.1 s),
/// a claim and a call, on a machine shared with other builds.
const SLACK: Duration = Duration::from_millis(750);
/// Enough attempts that no delivery runs out during an outage.
const MAX_ATTEMPTS: i32 = 100;

/// A receiver that answers 204, or 503 to every call while `down` is set.
async fn switchable_sink() -> (HttpSink, Arc<AtomicBool>) {
    let sink = HttpSink::start([], Answer::status(204)).await;
    let down = Arc::new(AtomicBool::new(false));
    let flag = down.clone();
    sink.answer_matching_with(
        move |_| flag.load(Ordering::SeqCst),
        std::iter::repeat_n(Answer::status(503), 1_000_000),
    );
    (sink, down)
}

fn relay(db: &TestDb, sink: &HttpSink, breaker: Breaker) -> RunningRelay {
    let sender = WebhookSender::new(&WebhookConfig {
        url: sink.url(),
        secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned(),
        timeout: Duration::from_secs(10),
        allow_private: true,
    })
    .expect("webhook sender")
    .with_breaker(breaker);
    let effects: Arc<dyn JobHandler> = Arc::new(effects::workers(
        db.pool(24),
        None,
        Some(sender),
        ReceiptSettings::default(),
    ));
    let worker = format!("breaker-relay-{}", fastrand::u32(..));
    let mut settings = test_settings(&worker, &["order_webhook", "endpoint_notice"]);
    settings.concurrency = 16;
    settings.backoff = BACKOFF;
    spawn_relay(db, settings, effects)
}

fn place(conn: &mut PgConnection) -> i64 {
    let order = NewOrder::parse(&order_json("Ada Lovelace")).expect("valid order");
    place_order(conn, &order_enqueuer(), &order, None, MAX_ATTEMPTS)
        .expect("place order")
        .order_id()
}

/// The ceiling of the backoff after failed attempt `attempt`.
fn ceiling(attempt: i32) -> Duration {
    let doublings = u32::try_from(attempt - 1).unwrap_or(0).min(20);
    BACKOFF
        .base
        .saturating_mul(2_u32.pow(doublings))
        .min(BACKOFF.max)
}

#[derive(Debug, Queryable)]
struct Attempt {
    job_id: i64,
    attempt: i32,
    started_at: DateTime<Utc>,
    duration_ms: i32,
    outcome: String,
}

fn attempts(conn: &mut PgConnection, endpoint: i64) -> Vec<Attempt> {
    delivery_attempts::table
        .filter(delivery_attempts::endpoint_id.eq(endpoint))
        .order((delivery_attempts::job_id, delivery_attempts::attempt))
        .select((
            delivery_attempts::job_id,
            delivery_attempts::attempt,
            delivery_attempts::started_at,
            delivery_attempts::duration_ms,
            delivery_attempts::outcome,
        ))
        .load(conn)
        .expect("attempts")
}

/// Each retry's wait past its job's own backoff: how long after the failed
/// attempt ended, less the backoff ceiling for it, the next attempt began.
fn waits_past_backoff(attempts: &[Attempt]) -> Vec<(i64, i32, chrono::Duration)> {
    attempts
        .windows(2)
        .filter(|w| w[0].job_id == w[1].job_id && w[0].outcome != "ok")
        .map(|w| {
            let ended = w[0].started_at + chrono::Duration::milliseconds(w[0].duration_ms.into());
            let allowed = chrono::Duration::from_std(ceiling(w[0].attempt)).expect("small");
            (w[1].job_id, w[1].attempt, w[1].started_at - ended - allowed)
        })
        .collect()
}

fn pending_webhooks(conn: &mut PgConnection) -> i64 {
    jobs_all::table
        .filter(jobs_all::kind.eq("order_webhook"))
        .filter(jobs_all::status.ne("done"))
        .count()
        .get_result(conn)
        .expect("count")
}

fn assert_within_own_backoff(attempts: &[Attempt]) {
    let slack = chrono::Duration::from_std(SLACK).expect("small");
    let late: Vec<_> = waits_past_backoff(attempts)
        .into_iter()
        .filter(|(_, _, past)| *past > slack)
        .collect();
    assert!(
        late.is_empty(),
        "retries that waited longer than their own backoff + {SLACK:?} \
         (job, attempt, wait past the backoff): {late:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_down_for_three_seconds_delays_each_delivery_by_no_more_than_its_own_backoff() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let (sink, down) = switchable_sink().await;
    let (erp, _) = add_endpoint(&mut conn, "erp", &sink, None, 16);
    let relay = relay(&db, &sink, Breaker::default());

    down.store(true, Ordering::SeqCst);
    let outage = std::time::Instant::now();
    let mut orders = Vec::new();
    while outage.elapsed() < Duration::from_secs(3) {
        orders.push(place(&mut conn));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    down.store(false, Ordering::SeqCst);
    let back_at = Utc::now();
    wait_until("every delivery done", Duration::from_secs(60), || {
        pending_webhooks(&mut conn) == 0
    })
    .await;
    relay.stop().await;

    let attempts = attempts(&mut conn, erp);
    let failed = attempts.iter().filter(|a| a.outcome != "ok").count();
    assert_within_own_backoff(&attempts);
    assert!(
        failed > orders.len(),
        "the outage was seen: {failed} failed"
    );
    let last_ok = attempts
        .iter()
        .filter(|a| a.outcome == "ok")
        .map(|a| a.started_at)
        .max()
        .expect("deliveries");
    let after_return = (last_ok - back_at).to_std().unwrap_or_default();
    eprintln!(
        "{} orders during a 3 s outage, {failed} failed calls; the last delivery {after_return:?} \
         after the receiver came back",
        orders.len()
    );
    assert!(
        after_return <= BACKOFF.max + SLACK,
        "the last delivery came {after_return:?} after the receiver was back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_refuses_one_event_type_twice_slows_nothing_else() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = HttpSink::start([], Answer::status(204)).await;
    // Each order.paid event is refused twice, then accepted; everything
    // else is accepted at once.
    let refused: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let counts = refused.clone();
    sink.answer_matching_with(
        move |body| {
            let Ok(event) = serde_json::from_slice::<serde_json::Value>(body) else {
                return false;
            };
            if event["type"] != "order.paid" {
                return false;
            }
            let mut counts = counts.lock().expect("counts");
            let seen = counts.entry(event["id"].to_string()).or_default();
            *seen += 1;
            *seen <= 2
        },
        std::iter::repeat_n(Answer::status(500), 1_000_000),
    );
    let (erp, _) = add_endpoint(&mut conn, "erp", &sink, None, 16);
    // The control: a receiver that takes everything, fed the same events by
    // the same relay. A late erp delivery is the breaker's doing only if
    // the control's copy of the event went on time; on a busy machine both
    // run late together.
    let healthy = HttpSink::start([], Answer::status(204)).await;
    let (control, _) = add_endpoint(&mut conn, "control", &healthy, None, 16);
    let relay = relay(&db, &sink, Breaker::default());

    let paid: Vec<i64> = (0..8).map(|_| place(&mut conn)).collect();
    for &order in &paid {
        transition(
            &mut conn,
            order,
            "pay",
            serde_json::json!({"payment_reference": "pi_1"}),
        );
    }
    // New orders keep coming while the paid events are being refused.
    for _ in 0..20 {
        place(&mut conn);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_until("every delivery done", Duration::from_secs(60), || {
        pending_webhooks(&mut conn) == 0
    })
    .await;
    relay.stop().await;

    let control_attempts = attempts(&mut conn, control);
    let attempts = attempts(&mut conn, erp);
    let refusals = attempts.iter().filter(|a| a.outcome != "ok").count();
    assert_eq!(refusals, 16, "each paid event refused twice");
    assert_within_own_backoff(&attempts);
    assert!(
        control_attempts
            .iter()
            .all(|a| a.outcome == "ok" && a.attempt == 1),
        "the control refused nothing: {control_attempts:?}"
    );
    // Every erp delivery that was not refused went through at its first
    // attempt, as soon as the control's copy of the same event.
    let events = delivery_events(&mut conn);
    let control_started: HashMap<i64, DateTime<Utc>> = control_attempts
        .iter()
        .map(|a| (events[&a.job_id], a.started_at))
        .collect();
    let refused_jobs: std::collections::HashSet<i64> = attempts
        .iter()
        .filter(|a| a.outcome != "ok")
        .map(|a| a.job_id)
        .collect();
    let behind: Vec<(i64, chrono::Duration)> = attempts
        .iter()
        .filter(|a| !refused_jobs.contains(&a.job_id))
        .map(|a| {
            assert_eq!(a.attempt, 1, "job {} was tried more than once", a.job_id);
            let event = events[&a.job_id];
            (event, a.started_at - control_started[&event])
        })
        .collect();
    assert_eq!(
        behind.len(),
        28,
        "each of the 28 orders' order.placed reached erp"
    );
    let (event, most) = behind
        .iter()
        .copied()
        .max_by_key(|(_, lag)| *lag)
        .expect("deliveries");
    eprintln!(
        "{refusals} refusals; the erp delivery most behind the control's (event {event}) \
         started {} ms after it",
        most.num_milliseconds()
    );
    assert!(
        most <= chrono::Duration::from_std(SLACK).expect("small"),
        "event {event} went to the control {} ms before the erp took it",
        most.num_milliseconds()
    );
}

/// The event each order_webhook job delivers, by job id.
fn delivery_events(conn: &mut PgConnection) -> HashMap<i64, i64> {
    jobs_all::table
        .filter(jobs_all::kind.eq("order_webhook"))
        .select((jobs_all::id, jobs_all::payload))
        .load::<(i64, serde_json::Value)>(conn)
        .expect("jobs")
        .into_iter()
        .filter_map(|(id, payload)| Some((id, payload["event_id"].as_i64()?)))
        .collect()
}

/// The breaker of these tests: tripped after 0.5 s of failures, probing at
/// most every second.
fn short_breaker() -> Breaker {
    Breaker {
        trip_after: Duration::from_millis(500),
        probe_max: Duration::from_secs(1),
        ..Breaker::default()
    }
}

/// Deliveries queued behind the dead receiver: ten times the calls it may
/// get, so that a breaker letting the backlog through cannot pass.
const BACKLOG: usize = 1000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_receiver_with_a_thousand_queued_deliveries_gets_a_few_dozen_calls_then_everything_within_a_probe_wait()
 {
    // Loud, not alone: the bounds (40 calls while dead; the first delivery
    // within 1.75 s of the receiver's return, which falls somewhere in the
    // 1 s probe wait, plus scheduling; the backlog within 20 s) hold with
    // both cores busy beside the bench smoke test.
    let _loud = crate::support::seats::loud();
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let (sink, down) = switchable_sink().await;
    let (erp, _) = add_endpoint(&mut conn, "erp", &sink, None, 16);
    let breaker = short_breaker();
    let relay = relay(&db, &sink, breaker);

    down.store(true, Ordering::SeqCst);
    let paused = |conn: &mut PgConnection| {
        concurrency_state(conn, &endpoint_key(erp))
            .expect("key")
            .and_then(|s| s.limit.paused_until)
    };
    // Deliveries trickle in until the breaker trips.
    let tripping = std::time::Instant::now();
    while paused(&mut conn).is_none() {
        assert!(
            tripping.elapsed() < Duration::from_secs(30),
            "the breaker never tripped"
        );
        place(&mut conn);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("tripped after {:?}", tripping.elapsed());
    // A thousand more deliveries queue up behind the dead receiver, which
    // then sees three probe waits: a breaker that let the backlog through,
    // or probed with more than one call, or more often, would have spent its
    // few dozen calls by then.
    conn.transaction(|conn| {
        for _ in 0..BACKLOG {
            place(conn);
        }
        QueryResult::Ok(())
    })
    .expect("place");
    tokio::time::sleep(breaker.probe_max * 3).await;

    // The last failed probe's job says when it runs: at the next probe (read
    // again if a probe moved the pause meanwhile).
    let (run_after, next_probe) = loop {
        let before = paused(&mut conn).expect("still tripped");
        let probe_job: i64 = delivery_attempts::table
            .filter(delivery_attempts::endpoint_id.eq(erp))
            .order(delivery_attempts::id.desc())
            .select(delivery_attempts::job_id)
            .first(&mut conn)
            .expect("a probe");
        let (run_after, status): (DateTime<Utc>, String) = jobs_all::table
            .find(probe_job)
            .select((jobs_all::run_after, jobs_all::status))
            .first(&mut conn)
            .expect("the probe's job");
        // Until its outcome is written, the job still shows its claim.
        if status == "pending" && paused(&mut conn) == Some(before) {
            break (run_after, before);
        }
    };
    let calls_while_dead = sink.requests().iter().filter(|r| r.answered == 503).count();
    down.store(false, Ordering::SeqCst);
    let back_at = Utc::now();
    wait_until("every delivery done", Duration::from_secs(120), || {
        pending_webhooks(&mut conn) == 0
    })
    .await;
    relay.stop().await;

    let delivered = sink.requests();
    let ok: Vec<DateTime<Utc>> = delivered
        .iter()
        .filter(|r| r.answered == 204)
        .map(|r| r.at)
        .collect();
    let first_ok = ok.iter().min().copied().expect("deliveries");
    let last_ok = ok.iter().max().copied().expect("deliveries");
    let recovered_in = (first_ok - back_at).to_std().unwrap_or_default();
    let drained_in = (last_ok - first_ok).to_std().unwrap_or_default();
    eprintln!(
        "{calls_while_dead} calls while dead; {} deliveries; the first {recovered_in:?} after \
         the receiver came back, the last {drained_in:?} after the first",
        ok.len()
    );
    assert!(ok.len() >= BACKLOG, "{} delivered", ok.len());
    assert!(
        calls_while_dead <= 40,
        "{calls_while_dead} calls to a dead receiver"
    );
    assert!(
        run_after + chrono::Duration::milliseconds(10) >= next_probe,
        "the failed probe's job says it runs at {run_after}, but the next probe is at {next_probe}"
    );
    assert!(
        recovered_in <= breaker.probe_max + SLACK,
        "the first delivery came {recovered_in:?} after the receiver was back"
    );
    // At least 50 a second: the backlog goes at once, not a probe at a time.
    assert!(
        drained_in <= Duration::from_millis(BACKLOG as u64 * 20),
        "the backlog took {drained_in:?} to drain after the first success"
    );
}
