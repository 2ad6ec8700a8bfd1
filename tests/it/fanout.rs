//! Deliveries past `FANOUT_INLINE`: the order's transaction writes one
//! `order_fanout` job, which writes the deliveries after commit, each
//! (event, endpoint) once, in event order per endpoint, to the endpoints
//! subscribed when the event happened.

use std::sync::Arc;
use std::time::Duration;

use diesel::prelude::*;
use order_service::effects::receipt::ReceiptSettings;
use order_service::effects::webhook::{WebhookConfig, WebhookSender};
use order_service::effects::{self, JobHandler};
use order_service::orders::jobs::OrderFanout;
use order_service::orders::{
    EventJobs, NewOrder, Transition, expand_fanout, expand_fanout_step, order_enqueuer,
    place_order, transition_order,
};
use order_service::schema::{endpoints, jobs_all};
use serde_json::json;

use crate::endpoint_delivery::add_endpoint;
use crate::support::http::{Answer, HttpSink};
use crate::support::{RunningRelay, TestDb, order_json, spawn_relay, test_settings, wait_until};

fn inline(fanout_inline: usize) -> EventJobs {
    EventJobs {
        max_attempts: 8,
        fanout_inline,
    }
}

fn place_with(conn: &mut PgConnection, jobs: EventJobs) -> i64 {
    let order = NewOrder::parse(&order_json("Ada Lovelace")).expect("valid order");
    place_order(conn, &order_enqueuer(), &order, None, jobs)
        .expect("placed")
        .order_id()
}

fn move_order(conn: &mut PgConnection, order_id: i64, action: &str, jobs: EventJobs) {
    let body = match action {
        "pay" => json!({"payment_reference": "pi_1"}),
        "ship" => json!({"carrier": "DHL", "tracking_number": "JD0001"}),
        _ => json!({}),
    };
    let transition = Transition::parse(action, &body).expect("a transition");
    transition_order(conn, &order_enqueuer(), order_id, &transition, None, jobs).expect(action);
}

/// The order's jobs of `kind`, by id.
fn jobs_of(conn: &mut PgConnection, order_id: i64, kind: &str) -> Vec<serde_json::Value> {
    jobs_all::table
        .filter(jobs_all::order_id.eq(order_id))
        .filter(jobs_all::kind.eq(kind))
        .order(jobs_all::id)
        .select(jobs_all::payload)
        .load(conn)
        .expect("jobs")
}

fn fanouts(conn: &mut PgConnection, order_id: i64) -> Vec<OrderFanout> {
    jobs_of(conn, order_id, "order_fanout")
        .into_iter()
        .map(|p| serde_json::from_value(p).expect("an order_fanout payload"))
        .collect()
}

/// (event, endpoint) of each of the order's webhook jobs.
fn deliveries(conn: &mut PgConnection, order_id: i64) -> Vec<(i64, i64)> {
    let mut pairs: Vec<(i64, i64)> = jobs_of(conn, order_id, "order_webhook")
        .iter()
        .map(|p| {
            (
                p["event_id"].as_i64().expect("event"),
                p["endpoint_id"].as_i64().expect("endpoint"),
            )
        })
        .collect();
    pairs.sort_unstable();
    pairs
}

/// A relay in this process that fans out and delivers.
fn fanout_relay(db: &TestDb, fallback: &HttpSink) -> RunningRelay {
    let sender = WebhookSender::new(&WebhookConfig {
        url: fallback.url(),
        secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned(),
        timeout: Duration::from_secs(30),
        allow_private: true,
    })
    .expect("webhook sender");
    let effects: Arc<dyn JobHandler> = Arc::new(effects::workers(
        db.pool(12),
        None,
        Some(sender),
        ReceiptSettings::default(),
    ));
    let mut settings = test_settings("fanout-relay", &["order_webhook", "order_fanout"]);
    settings.concurrency = 8;
    spawn_relay(db, settings, effects)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_fanout_inline_each_endpoint_gets_each_event_once_and_in_order() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let sinks: Vec<HttpSink> = sinks(5).await;
    for (i, sink) in sinks.iter().enumerate() {
        add_endpoint(&mut conn, &format!("partner-{i}"), sink, None, 4);
    }
    let jobs = inline(2);
    let order = place_with(&mut conn, jobs);
    assert_eq!(
        (
            fanouts(&mut conn, order).len(),
            deliveries(&mut conn, order).len()
        ),
        (1, 0),
        "five subscribers past an inline limit of two: the placement writes one fan-out and no delivery"
    );
    move_order(&mut conn, order, "pay", jobs);
    move_order(&mut conn, order, "ship", jobs);
    assert_eq!(fanouts(&mut conn, order).len(), 3);

    let relay = fanout_relay(&db, &sinks[0]);
    wait_until("15 deliveries are done", Duration::from_secs(60), || {
        jobs_all::table
            .filter(jobs_all::order_id.eq(order))
            .filter(jobs_all::kind.eq_any(["order_webhook", "order_fanout"]))
            .filter(jobs_all::status.eq("done"))
            .count()
            .get_result::<i64>(&mut conn)
            .expect("count")
            == 18
    })
    .await;
    relay.stop().await;

    let pairs = deliveries(&mut conn, order);
    let mut unique = pairs.clone();
    unique.dedup();
    assert_eq!((pairs.len(), unique.len()), (15, 15), "{pairs:?}");
    for (i, sink) in sinks.iter().enumerate() {
        let types: Vec<String> = sink
            .requests()
            .iter()
            .map(|r| r.json()["type"].as_str().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(
            types,
            ["order.placed", "order.paid", "order.shipped"],
            "partner-{i} got the order's events once each, in order"
        );
    }
}

async fn sinks(n: usize) -> Vec<HttpSink> {
    let mut sinks = Vec::with_capacity(n);
    for _ in 0..n {
        sinks.push(HttpSink::start([], Answer::status(204)).await);
    }
    sinks
}

#[tokio::test]
async fn a_fanout_run_again_after_dying_halfway_or_beside_a_zombie_writes_no_delivery_twice() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = HttpSink::start([], Answer::status(204)).await;
    for i in 0..7 {
        add_endpoint(&mut conn, &format!("partner-{i}"), &sink, None, 4);
    }
    let order = place_with(&mut conn, inline(0));
    let [fanout] = fanouts(&mut conn, order).try_into().expect("one fan-out");
    assert_eq!(fanout.webhook_endpoints.len(), 7);

    // The first attempt writes one batch and dies.
    let enqueuer = order_enqueuer();
    assert_eq!(
        expand_fanout_step(&mut conn, &enqueuer, &fanout, 3).expect("a batch"),
        3
    );
    // The retry and the zombie of the first attempt run side by side.
    let runs: Vec<std::thread::JoinHandle<usize>> = (0..2)
        .map(|_| {
            let mut conn = db.conn();
            let fanout = fanout.clone();
            std::thread::spawn(move || {
                expand_fanout(&mut conn, &order_enqueuer(), &fanout, 1)
                    .expect("fan-out")
                    .written
            })
        })
        .collect();
    let written: usize = runs.into_iter().map(|r| r.join().expect("joins")).sum();
    assert_eq!(written, 4, "the two runs wrote the other four between them");
    // A third run, after the job is done, finds nothing left.
    assert_eq!(
        expand_fanout(&mut conn, &enqueuer, &fanout, 500)
            .expect("fan-out")
            .written,
        0
    );
    let pairs = deliveries(&mut conn, order);
    let expected: Vec<(i64, i64)> = fanout
        .webhook_endpoints
        .iter()
        .map(|&endpoint| (fanout.event_id, endpoint))
        .collect();
    assert_eq!(pairs, expected, "one delivery per subscribed endpoint");
}

#[tokio::test]
async fn a_fanout_goes_to_the_endpoints_subscribed_when_the_event_happened() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = HttpSink::start([], Answer::status(204)).await;
    let (first, _) = add_endpoint(&mut conn, "first", &sink, None, 4);
    let (second, _) = add_endpoint(&mut conn, "second", &sink, None, 4);
    let (paid_only, _) = add_endpoint(&mut conn, "paid-only", &sink, Some("order.paid"), 4);
    let order = place_with(&mut conn, inline(0));
    // After the event: one endpoint added, one disabled.
    add_endpoint(&mut conn, "late", &sink, None, 4);
    diesel::update(endpoints::table.find(second))
        .set(endpoints::enabled.eq(false))
        .execute(&mut conn)
        .expect("disable");

    let [fanout] = fanouts(&mut conn, order).try_into().expect("one fan-out");
    expand_fanout(&mut conn, &order_enqueuer(), &fanout, 500).expect("fan-out");
    let endpoints: Vec<i64> = deliveries(&mut conn, order)
        .into_iter()
        .map(|(_, endpoint)| endpoint)
        .collect();
    assert_eq!(
        endpoints,
        [first, second],
        "the late endpoint gets none of an earlier event, the disabled one keeps its delivery \
         (which waits for it to be enabled, as any queued delivery does), and paid-only \
         ({paid_only}) was never subscribed to order.placed"
    );
}

#[tokio::test]
async fn an_event_behind_an_unfinished_fanout_goes_through_a_fanout_too() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = HttpSink::start([], Answer::status(204)).await;
    let (a, _) = add_endpoint(&mut conn, "a", &sink, None, 4);
    let (b, _) = add_endpoint(&mut conn, "b", &sink, None, 4);
    let (c, _) = add_endpoint(&mut conn, "c", &sink, None, 4);
    let jobs = inline(2);
    let order = place_with(&mut conn, jobs);
    diesel::delete(endpoints::table.find(c))
        .execute(&mut conn)
        .expect("remove c");
    // Two subscribers now, within the inline limit; but the placement's
    // fan-out has not run, and the payment's deliveries must not overtake it.
    move_order(&mut conn, order, "pay", jobs);
    let fanouts = fanouts(&mut conn, order);
    assert_eq!(fanouts.len(), 2, "the payment went through a fan-out too");
    assert!(deliveries(&mut conn, order).is_empty());
    assert_eq!(fanouts[1].webhook_endpoints, [a, b]);

    // Once the fan-outs have run, the next event is written inline again.
    let enqueuer = order_enqueuer();
    for fanout in &fanouts {
        expand_fanout(&mut conn, &enqueuer, fanout, 500).expect("fan-out");
    }
    let done = crate::support::make_done(
        &mut conn,
        &format!("order_id = {order} AND kind = 'order_fanout'"),
        "now()",
    );
    assert_eq!(done, 2);
    move_order(&mut conn, order, "ship", jobs);
    assert_eq!(
        self::fanouts(&mut conn, order).len(),
        2,
        "no fan-out for the shipment"
    );
    assert_eq!(deliveries(&mut conn, order).len(), 3 + 2 + 2);
}
