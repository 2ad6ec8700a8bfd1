//! Ordered delivery with real relays: every order's events reach the receiver
//! in `seq` order, whatever fails, whoever claims them, whoever crashes.

use std::collections::HashMap;
use std::time::Duration;

use diesel::prelude::*;
use serde_json::{Value, json};

use super::{Sinks, place_orders, wait_all_terminal};
use crate::support::http::{Answer, Recorded};
use crate::support::process::{BinProcess, Launch};
use crate::support::{TestDb, transition, wait_until};

const MINUTE: Duration = Duration::from_secs(60);

fn pay_ship_deliver(conn: &mut PgConnection, order_id: i64) -> Vec<i64> {
    vec![
        transition(
            conn,
            order_id,
            "pay",
            json!({"payment_reference": format!("pi_{order_id}")}),
        ),
        transition(
            conn,
            order_id,
            "ship",
            json!({"carrier": "DHL", "tracking_number": format!("JD{order_id:08}")}),
        ),
        transition(conn, order_id, "deliver", json!({})),
    ]
}

/// (order id, seq, status answered) of every webhook request, in arrival order.
fn deliveries(requests: &[Recorded]) -> Vec<(i64, i64, u16)> {
    requests
        .iter()
        .map(|r| {
            let body = r.json();
            (
                body["data"]["order"]["id"].as_i64().expect("order id"),
                body["data"]["seq"].as_i64().expect("seq"),
                r.answered,
            )
        })
        .collect()
}

/// Per order, in arrival order: no request for an event before every earlier
/// event of that order was answered 2xx, and every event delivered.
fn assert_in_order(requests: &[Recorded], orders: &[i64], events_per_order: i64) {
    let mut seen: HashMap<i64, Vec<(i64, u16)>> = HashMap::new();
    for (order, seq, answered) in deliveries(requests) {
        seen.entry(order).or_default().push((seq, answered));
    }
    for order in orders {
        let calls = seen.get(order).cloned().unwrap_or_default();
        let mut delivered = 0;
        for (seq, answered) in &calls {
            assert_eq!(
                *seq,
                delivered + 1,
                "order {order}: a request for event {seq} while event {} was not yet delivered: {calls:?}",
                delivered + 1
            );
            if (200..300).contains(answered) {
                delivered += 1;
            }
        }
        assert_eq!(delivered, events_per_order, "order {order}: {calls:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_orders_events_arrive_in_seq_order_with_three_relays_and_a_flaky_receiver() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let sinks = Sinks::start([], Answer::status(200)).await;
    // Deterministic flakiness: the first delivery of every third event fails
    // (event ids start at 1 in a fresh database; 20 orders make 80 events).
    for event in (3..=80).step_by(3) {
        sinks.http.answer_matching_with(
            move |body| {
                serde_json::from_slice::<Value>(body)
                    .ok()
                    .and_then(|b| b["id"].as_i64())
                    == Some(event)
            },
            [Answer::status(500)],
        );
    }
    // The relays first: the first of them creates the `default` endpoint
    // from WEBHOOK_URL, as a deployment's start does before any order is
    // placed. (Orders placed while no endpoint row exists queue their first
    // delivery without an endpoint (under the order's own key), and their later deliveries to
    // `default` queue behind it: endpoint_delivery.rs's
    // an_order_placed_before_any_endpoint_gets_its_later_events_at_default_in_order.)
    // This test is about ordering once endpoints exist.
    let relays: Vec<BinProcess> = {
        let mut relays = Vec::new();
        for name in ["order-a", "order-b", "order-c"] {
            relays.push(BinProcess::start_relay(sinks.relay(name, &db.url)).await.0);
        }
        relays
    };
    let orders = place_orders(&mut conn, 20, 8);
    // Transitions arrive while the relays work.
    for order in &orders {
        pay_ship_deliver(&mut conn, *order);
    }
    wait_all_terminal(&mut conn, 2 * MINUTE).await;
    for mut relay in relays {
        relay.terminate().await;
    }

    let requests = sinks.http.requests();
    assert!(
        requests.iter().any(|r| r.answered == 500),
        "some deliveries failed on purpose"
    );
    assert_in_order(&requests, &orders, 4);
    let shipped = sinks
        .smtp
        .accepted()
        .iter()
        .filter(|m| {
            m.header("subject")
                .is_some_and(|s| s.contains("on its way"))
        })
        .count();
    assert_eq!(shipped, orders.len(), "one shipped email per order");
    let failed: i64 = order_service::schema::jobs_all::table
        .filter(order_service::schema::jobs_all::status.eq("failed"))
        .count()
        .get_result(&mut conn)
        .expect("count");
    assert_eq!(failed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_head_blocks_only_its_own_order_until_an_operator_retries_it() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let sinks = Sinks::start([], Answer::status(200)).await;
    let orders = place_orders(&mut conn, 2, 8);
    let (stuck, fine) = (orders[0], orders[1]);
    // The receiver refuses the stuck order's placed event for good (a 4xx).
    sinks.http.answer_matching_with(
        move |body| {
            serde_json::from_slice::<Value>(body).ok().is_some_and(|b| {
                b["type"] == "order.placed" && b["data"]["order"]["id"].as_i64() == Some(stuck)
            })
        },
        [Answer::status(422).body("unknown customer")],
    );
    for order in &orders {
        pay_ship_deliver(&mut conn, *order);
    }
    let (mut relay, _) = BinProcess::start_relay(sinks.relay("blocked", &db.url)).await;
    wait_until("the other order's four events delivered", MINUTE, || {
        deliveries(&sinks.http.requests())
            .iter()
            .filter(|(o, _, s)| *o == fine && *s == 200)
            .count()
            == 4
    })
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let stuck_calls: Vec<(i64, i64, u16)> = deliveries(&sinks.http.requests())
        .into_iter()
        .filter(|(o, _, _)| *o == stuck)
        .collect();
    assert_eq!(
        stuck_calls,
        vec![(stuck, 1, 422)],
        "nothing after the failed head"
    );

    let mut blocked = Launch::new("blocked-cli", &["jobs", "blocked"])
        .env("DATABASE_URL", &db.url)
        .spawn();
    assert_eq!(blocked.wait_exit(MINUTE).await.code(), Some(0));
    let table = blocked.stdout();
    assert!(
        table.contains(&format!("order-{stuck}-webhooks")) && table.contains("422"),
        "{table}"
    );
    let head: i64 = order_service::schema::jobs_all::table
        .filter(order_service::schema::jobs_all::status.eq("failed"))
        .select(order_service::schema::jobs_all::id)
        .first(&mut conn)
        .expect("the failed head");
    let mut retry = Launch::new("retry-cli", &["jobs", "retry", &head.to_string()])
        .env("DATABASE_URL", &db.url)
        .spawn();
    assert_eq!(
        retry.wait_exit(MINUTE).await.code(),
        Some(0),
        "{}",
        retry.stderr()
    );

    wait_all_terminal(&mut conn, MINUTE).await;
    relay.terminate().await;
    assert_in_order(
        &sinks
            .http
            .requests()
            .into_iter()
            .filter(|r| r.answered != 422)
            .collect::<Vec<_>>(),
        &orders,
        4,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_mid_delivery_lets_no_later_event_overtake() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let sinks = Sinks::start([], Answer::status(200)).await;
    let order = place_orders(&mut conn, 1, 8)[0];
    sinks.http.answer_matching_with(
        |body| {
            serde_json::from_slice::<Value>(body)
                .ok()
                .is_some_and(|b| b["type"] == "order.paid")
        },
        [Answer::Hang(Duration::from_secs(120))],
    );
    pay_ship_deliver(&mut conn, order);
    let (mut first, _) =
        BinProcess::start_relay(sinks.relay("dies", &db.url).env("WEBHOOK_TIMEOUT", "60s")).await;
    wait_until("the paid event in flight", MINUTE, || {
        deliveries(&sinks.http.requests())
            .iter()
            .any(|(_, seq, _)| *seq == 2)
    })
    .await;
    first.sigkill();
    first.wait_exit(Duration::from_secs(10)).await;
    let (mut second, _) = BinProcess::start_relay(sinks.relay("takes-over", &db.url)).await;
    wait_all_terminal(&mut conn, MINUTE).await;
    second.terminate().await;

    let calls: Vec<i64> = deliveries(&sinks.http.requests())
        .iter()
        .map(|(_, seq, _)| *seq)
        .collect();
    assert_eq!(
        calls,
        vec![1, 2, 2, 3, 4],
        "the paid event again, then the rest"
    );
}
