//! A slow endpoint never costs a fast one its slots: what the relay
//! guarantees, asserted as the mechanism, not as a time. The slow
//! endpoint's receiver answers none of its calls while the test runs, so
//! any fast delivery that waited behind one of them would wait for the
//! whole test; the timing of the same setting is a figure of
//! `bench --endpoints` (docs/performance.md).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use order_service::effects::receipt::ReceiptSettings;
use order_service::effects::webhook::{WebhookConfig, WebhookSender};
use order_service::effects::{self, JobHandler};
use order_service::orders::endpoint_key;

use crate::endpoint_delivery::{add_endpoint, place};
use crate::support::http::{Answer, HttpSink};
use crate::support::{RunningRelay, TestDb, init_tracing, spawn_relay, test_settings};

/// The relay's slots.
const SLOTS: usize = 16;
/// The slow endpoint's `max_in_flight`.
const SLOW_SLOTS: i32 = 4;
/// Orders placed while the relay runs, each one delivery to each endpoint.
const ORDERS: usize = 300;
/// How long the slow receiver keeps each call: past the end of the test
/// (the relay's webhook timeout is 60 s, so the calls stay open too).
const HOLD: Duration = Duration::from_secs(55);

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Jobs of the concurrency key `key` in `status`.
fn count_jobs(conn: &mut PgConnection, key: &str, status: &str) -> QueryResult<i64> {
    diesel::sql_query("SELECT count(*) AS n FROM jobs WHERE concurrency_key = $1 AND status = $2")
        .bind::<Text, _>(key)
        .bind::<Text, _>(status)
        .get_result::<Count>(conn)
        .map(|c| c.n)
}

fn jobs_of(conn: &mut PgConnection, key: &str, status: &str) -> i64 {
    count_jobs(conn, key, status).expect("count")
}

/// A relay with [`SLOTS`] slots delivering `order_webhook` jobs, which
/// stops at once when asked (the slow receiver's calls are still open).
fn relay(db: &TestDb, fallback: &HttpSink) -> RunningRelay {
    let sender = WebhookSender::new(&WebhookConfig {
        url: fallback.url(),
        secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned(),
        timeout: Duration::from_secs(60),
        allow_private: true,
    })
    .expect("webhook sender");
    let effects: Arc<dyn JobHandler> = Arc::new(effects::workers(
        db.pool(u32::try_from(SLOTS).unwrap_or(16) + 4),
        None,
        Some(sender),
        ReceiptSettings::default(),
    ));
    let mut settings = test_settings("fairness-relay", &["order_webhook"]);
    settings.concurrency = SLOTS;
    settings.shutdown_grace = Duration::from_millis(200);
    spawn_relay(db, settings, effects)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_saturated_slow_endpoint_holds_only_its_own_slots_and_the_fast_one_keeps_flowing() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let fast = HttpSink::start([], Answer::status(204)).await;
    let slow = HttpSink::start([], Answer::Hang(HOLD)).await;
    add_endpoint(&mut conn, "fast", &fast, None, SLOTS as i32);
    let (slow_id, _) = add_endpoint(&mut conn, "slow", &slow, None, SLOW_SLOTS);
    let slow_key = endpoint_key(slow_id);

    // The slow endpoint's claims, as the database holds them, sampled
    // throughout: never more than its max_in_flight.
    let most_claimed = Arc::new(AtomicI64::new(0));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (url, key) = (db.url.clone(), slow_key.clone());
        let (most, running) = (Arc::clone(&most_claimed), Arc::clone(&sampling));
        tokio::task::spawn_blocking(move || {
            let mut conn = PgConnection::establish(&url).expect("connect");
            while running.load(Ordering::Acquire) {
                match count_jobs(&mut conn, &key, "processing") {
                    Ok(claimed) => most.fetch_max(claimed, Ordering::AcqRel),
                    // The test ended (its database dropped) under us.
                    Err(_) => break,
                };
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };

    let relay = relay(&db, &fast);
    // Orders keep coming while the slow endpoint is saturated: its backlog
    // grows beside the fast one's.
    let placing = {
        let url = db.url.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = PgConnection::establish(&url).expect("connect");
            for _ in 0..ORDERS {
                place(&mut conn);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    placing.await.expect("placing orders");
    // Every fast delivery is claimed and started while the slow receiver
    // holds its calls. A fast delivery that waited for a slot behind a slow
    // one would wait past this (the slow calls end after HOLD), and so
    // would one the relay stopped claiming for while the slow key was full.
    let deadline = std::time::Instant::now() + HOLD - Duration::from_secs(10);
    while fast.requests().len() < ORDERS {
        assert!(
            slow.most_open() <= SLOW_SLOTS as usize,
            "the slow receiver had {} calls open at once (max_in_flight {SLOW_SLOTS}); the fast \
             one has {} of {ORDERS}",
            slow.most_open(),
            fast.requests().len()
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the fast endpoint has {} of {ORDERS} deliveries while the slow one holds {} calls \
             (max_in_flight {SLOW_SLOTS}): fast deliveries stopped being claimed or started",
            fast.requests().len(),
            slow.requests().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sampling.store(false, Ordering::Release);
    sampler.await.expect("sampler");

    let slow_calls = slow.requests().len();
    let slow_waiting = jobs_of(&mut conn, &slow_key, "pending");
    let slow_claimed = jobs_of(&mut conn, &slow_key, "processing");
    eprintln!(
        "fast: {} of {ORDERS} delivered; slow: {slow_calls} calls open (most at once {}), \
         {slow_claimed} claimed, {slow_waiting} waiting; most claimed at once {}",
        fast.requests().len(),
        slow.most_open(),
        most_claimed.load(Ordering::Acquire)
    );
    // The slow endpoint holds exactly its max_in_flight: saturated, and no
    // call of it ended while the fast endpoint got all of its deliveries.
    assert_eq!(
        slow_calls, SLOW_SLOTS as usize,
        "calls the slow receiver got (max_in_flight {SLOW_SLOTS})"
    );
    assert!(
        slow.most_open() <= SLOW_SLOTS as usize,
        "the slow receiver had {} calls open at once (max_in_flight {SLOW_SLOTS})",
        slow.most_open()
    );
    assert!(
        most_claimed.load(Ordering::Acquire) <= i64::from(SLOW_SLOTS),
        "the slow endpoint held {} claims at once (max_in_flight {SLOW_SLOTS})",
        most_claimed.load(Ordering::Acquire)
    );
    assert_eq!(slow_claimed, i64::from(SLOW_SLOTS));
    assert_eq!(
        slow_waiting,
        (ORDERS - SLOW_SLOTS as usize) as i64,
        "the rest of the slow endpoint's deliveries wait for its slots"
    );
    drop(slow);
    relay.stop().await;
}
