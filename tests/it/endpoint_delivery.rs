//! Deliveries to endpoints: fan-out in the order's transaction, each
//! endpoint's own secrets, the attempt log, and jobs queued before endpoints.

use std::sync::Arc;
use std::time::Duration;

use diesel::prelude::*;
use order_service::effects::receipt::ReceiptSettings;
use order_service::effects::webhook::{WebhookConfig, WebhookSender};
use order_service::effects::{self, JobHandler};
use order_service::endpoints::breaker::Breaker;
use order_service::endpoints::spec::{EndpointName, EndpointUrl, EventTypes, SigningSecret};
use order_service::endpoints::{NewEndpoint, store, target};
use order_service::orders::order_enqueuer;
use order_service::orders::{
    NewOrder, Transition, delivery_key, endpoint_key, place_order, transition_order, webhook_key,
};
use order_service::schema::{delivery_attempts, jobs_all};
use serde_json::json;

use crate::support::http::{Answer, HttpSink, Recorded};
use crate::support::{
    RunningRelay, TestDb, init_tracing, order_json, spawn_relay, test_settings, transition,
    wait_until,
};

/// An endpoint named `name` at `sink`, subscribed to `events` (all: none);
/// returns its id and secret.
pub fn add_endpoint(
    conn: &mut PgConnection,
    name: &str,
    sink: &HttpSink,
    events: Option<&str>,
    max_in_flight: i32,
) -> (i64, String) {
    let secret = SigningSecret::generate().expect("a secret");
    let endpoint = store::add(
        conn,
        &NewEndpoint {
            name: EndpointName::parse(name).expect("name"),
            url: EndpointUrl::parse(sink.url().as_str(), true).expect("url"),
            event_types: events.map_or(EventTypes::ALL, |e| EventTypes::parse(e).expect("events")),
            rate_limit: None,
            max_in_flight,
            secret: secret.clone(),
            nats: None,
        },
        &order_service::sealed::Keyring::none(),
    )
    .expect("add endpoint");
    (endpoint.id, secret.expose().to_owned())
}

/// A relay in this process delivering order_webhook jobs; `fallback` is its
/// WEBHOOK_URL (used only where no `default` endpoint exists).
pub fn delivery_relay(db: &TestDb, fallback: &HttpSink, concurrency: usize) -> RunningRelay {
    delivery_relay_with(db, fallback, concurrency, Breaker::default())
}

/// [`delivery_relay`] with a breaker of its own (a shortened
/// ENDPOINT_DISABLE_AFTER); it also delivers endpoint notices.
pub fn delivery_relay_with(
    db: &TestDb,
    fallback: &HttpSink,
    concurrency: usize,
    breaker: Breaker,
) -> RunningRelay {
    let sender = WebhookSender::new(&WebhookConfig {
        url: fallback.url(),
        secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned(),
        timeout: Duration::from_secs(60),
        allow_private: true,
    })
    .expect("webhook sender")
    .with_breaker(breaker);
    let effects: Arc<dyn JobHandler> = Arc::new(effects::workers(
        db.pool(u32::try_from(concurrency).unwrap_or(16) + 4),
        None,
        Some(sender),
        ReceiptSettings::default(),
    ));
    // Each relay its own worker id: some tests run two.
    let worker = format!("delivery-relay-{}", fastrand::u32(..));
    let mut settings = test_settings(&worker, &["order_webhook", "endpoint_notice"]);
    settings.concurrency = concurrency;
    spawn_relay(db, settings, effects)
}

pub fn place(conn: &mut PgConnection) -> i64 {
    let order = NewOrder::parse(&order_json("Ada Lovelace")).expect("valid order");
    place_order(conn, &order_enqueuer(), &order, None, 8)
        .expect("place order")
        .order_id()
}

pub fn pay(conn: &mut PgConnection, order_id: i64) {
    let transition =
        Transition::parse("pay", &json!({"payment_reference": "pi_123"})).expect("pay");
    transition_order(conn, &order_enqueuer(), order_id, &transition, None, 8).expect("paid");
}

pub fn done_webhooks(conn: &mut PgConnection) -> i64 {
    jobs_all::table
        .filter(jobs_all::kind.eq("order_webhook"))
        .filter(jobs_all::status.eq("done"))
        .count()
        .get_result(conn)
        .expect("count")
}

/// The Standard Webhooks reference verifier (the `standardwebhooks` crate).
pub fn reference_verify(request: &Recorded, secret: &str) -> Result<(), String> {
    let verifier = standardwebhooks::Webhook::new(secret).map_err(|e| e.to_string())?;
    let mut headers = reqwest::header::HeaderMap::new();
    for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        if let Some(value) = request.header(name) {
            headers.insert(name, value.parse().expect("a header value"));
        }
    }
    verifier
        .verify(&request.body, &headers)
        .map_err(|e| e.to_string())
}

fn event_types(requests: &[Recorded]) -> Vec<String> {
    requests
        .iter()
        .map(|r| {
            r.json()["type"]
                .as_str()
                .unwrap_or("order.placed")
                .to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_endpoint_gets_its_events_signed_with_its_own_secret_only() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let erp = HttpSink::start([], Answer::status(204)).await;
    let analytics = HttpSink::start([], Answer::status(200)).await;
    let fallback = HttpSink::start([], Answer::status(204)).await;
    let (erp_id, erp_secret) = add_endpoint(&mut conn, "erp", &erp, None, 4);
    let (analytics_id, analytics_secret) =
        add_endpoint(&mut conn, "analytics", &analytics, Some("order.paid"), 4);

    let order_id = place(&mut conn);
    pay(&mut conn, order_id);
    let payloads: Vec<(serde_json::Value, Option<String>)> = jobs_all::table
        .filter(jobs_all::kind.eq("order_webhook"))
        .order(jobs_all::id)
        .select((jobs_all::payload, jobs_all::ordering_key))
        .load(&mut conn)
        .expect("jobs");
    let endpoints_of: Vec<(i64, String)> = payloads
        .iter()
        .map(|(p, k)| {
            (
                p["endpoint_id"].as_i64().expect("endpoint_id"),
                k.clone().expect("key"),
            )
        })
        .collect();
    assert_eq!(
        endpoints_of,
        vec![
            (erp_id, format!("endpoint:{erp_id}:order:{order_id}")),
            (erp_id, format!("endpoint:{erp_id}:order:{order_id}")),
            (
                analytics_id,
                format!("endpoint:{analytics_id}:order:{order_id}")
            ),
        ],
        "one delivery per subscribed endpoint and event, keyed per endpoint and order"
    );

    let relay = delivery_relay(&db, &fallback, 4);
    wait_until("three deliveries are done", Duration::from_secs(30), || {
        done_webhooks(&mut conn) == 3
    })
    .await;
    relay.stop().await;

    let to_erp = erp.requests();
    let to_analytics = analytics.requests();
    assert_eq!(event_types(&to_erp), ["order.placed", "order.paid"]);
    assert_eq!(event_types(&to_analytics), ["order.paid"]);
    assert!(
        fallback.requests().is_empty(),
        "nothing went to WEBHOOK_URL"
    );
    for request in &to_erp {
        reference_verify(request, &erp_secret).expect("erp's delivery verifies with erp's secret");
        assert!(
            reference_verify(request, &analytics_secret).is_err(),
            "erp's delivery must not verify with analytics' secret"
        );
    }
    for request in &to_analytics {
        reference_verify(request, &analytics_secret).expect("verifies with its own secret");
        assert!(reference_verify(request, &erp_secret).is_err());
    }

    let attempts: Vec<(i64, Option<i16>, String)> = delivery_attempts::table
        .order(delivery_attempts::id)
        .select((
            delivery_attempts::endpoint_id,
            delivery_attempts::status_code,
            delivery_attempts::outcome,
        ))
        .load(&mut conn)
        .expect("attempts");
    assert_eq!(attempts.len(), 3, "one attempt row per call: {attempts:?}");
    assert_eq!(attempts.iter().filter(|a| a.0 == erp_id).count(), 2);
    assert!(attempts.iter().all(|a| a.2 == "ok"), "{attempts:?}");
    assert!(
        attempts
            .iter()
            .any(|a| a.0 == analytics_id && a.1 == Some(200))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_secret_signs_beside_the_new_one_until_it_expires() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let erp = HttpSink::start([], Answer::status(204)).await;
    let (_, old_secret) = add_endpoint(&mut conn, "erp", &erp, None, 4);
    let new_secret = SigningSecret::generate().expect("a secret");
    store::rotate_secret(
        &mut conn,
        "erp",
        &new_secret,
        Duration::from_secs(3600),
        &order_service::sealed::Keyring::none(),
    )
    .expect("rotate");
    place(&mut conn);
    let relay = delivery_relay(&db, &erp, 2);
    wait_until("the delivery is done", Duration::from_secs(30), || {
        done_webhooks(&mut conn) == 1
    })
    .await;
    relay.stop().await;
    let request = &erp.requests()[0];
    reference_verify(request, new_secret.expose()).expect("the new secret verifies");
    reference_verify(request, &old_secret).expect("the old secret still verifies");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_queued_while_no_endpoint_existed_go_to_default() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    place(&mut conn);
    // A database without endpoints: the order's webhook is queued without
    // one, for `default`.
    let unaddressed: serde_json::Value = jobs_all::table
        .filter(jobs_all::kind.eq("order_webhook"))
        .select(jobs_all::payload)
        .first(&mut conn)
        .expect("the placement's delivery");
    assert_eq!(
        unaddressed.get("endpoint_id"),
        None,
        "no endpoints yet: {unaddressed}"
    );

    // Then a relay (or migrate) given WEBHOOK_URL writes `default`; another
    // endpoint exists too.
    let default_sink = HttpSink::start([], Answer::status(204)).await;
    let other = HttpSink::start([], Answer::status(204)).await;
    let default_secret = SigningSecret::generate().expect("a secret");
    target::upsert_default(
        &mut conn,
        &default_sink.url(),
        default_secret.expose(),
        &order_service::sealed::Keyring::none(),
    )
    .expect("default");
    add_endpoint(&mut conn, "erp", &other, None, 4);
    let fallback = HttpSink::start([], Answer::status(204)).await;

    let relay = delivery_relay(&db, &fallback, 2);
    wait_until(
        "the unaddressed delivery is done",
        Duration::from_secs(30),
        || done_webhooks(&mut conn) == 1,
    )
    .await;
    relay.stop().await;
    let requests = default_sink.requests();
    assert_eq!(requests.len(), 1, "it went to default");
    for request in &requests {
        reference_verify(request, default_secret.expose()).expect("signed by default's secret");
    }
    assert!(
        other.requests().is_empty(),
        "erp never saw jobs queued before it"
    );
    assert!(fallback.requests().is_empty());
}

/// The order's deliveries, oldest first: ordering key, concurrency key and
/// the endpoint in the payload.
fn delivery_keys(
    conn: &mut PgConnection,
    order_id: i64,
) -> Vec<(Option<String>, Option<String>, Option<i64>)> {
    jobs_all::table
        .filter(jobs_all::kind.eq("order_webhook"))
        .filter(jobs_all::order_id.eq(order_id))
        .order(jobs_all::id)
        .select((
            jobs_all::ordering_key,
            jobs_all::concurrency_key,
            jobs_all::payload,
        ))
        .load::<(Option<String>, Option<String>, serde_json::Value)>(conn)
        .expect("the order's deliveries")
        .into_iter()
        .map(|(key, limit, payload)| (key, limit, payload["endpoint_id"].as_i64()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_placed_before_any_endpoint_gets_its_later_events_at_default_in_order() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    // Placed while the database has no endpoint row: its delivery is queued
    // without an endpoint, under the order's unaddressed key, for `default`.
    let order_id = place(&mut conn);
    let unaddressed = webhook_key(order_id);
    // The receiver fails the first delivery of order.placed, and its retry
    // waits a second (Retry-After): time enough for a later event to overtake
    // it, were it not queued behind.
    let sink = HttpSink::start([], Answer::status(204)).await;
    sink.answer_matching_with(
        |body| {
            serde_json::from_slice::<serde_json::Value>(body)
                .is_ok_and(|b| b["type"] == "order.placed")
        },
        [Answer::status(503).header("retry-after", "1")],
    );
    // Then `serve` or a relay given WEBHOOK_URL writes `default`, as
    // write_default does.
    let secret = SigningSecret::generate().expect("a secret");
    let default_id = target::upsert_default(
        &mut conn,
        &sink.url(),
        secret.expose(),
        &order_service::sealed::Keyring::none(),
    )
    .expect("default");

    // Paid and shipped while the placed delivery is unfinished.
    pay(&mut conn, order_id);
    transition(
        &mut conn,
        order_id,
        "ship",
        json!({"carrier": "DHL", "tracking_number": "JD0001"}),
    );
    let queued = delivery_keys(&mut conn, order_id);

    let fallback = HttpSink::start([], Answer::status(204)).await;
    let relay = delivery_relay(&db, &fallback, 2);
    wait_until(
        "placed, paid and shipped delivered",
        Duration::from_secs(30),
        || done_webhooks(&mut conn) == 3,
    )
    .await;
    // Every unaddressed delivery has ended: the next event goes under the
    // endpoint's own key.
    transition(&mut conn, order_id, "deliver", json!({}));
    let after_drain = delivery_keys(&mut conn, order_id);
    wait_until("delivered delivered", Duration::from_secs(30), || {
        done_webhooks(&mut conn) == 4
    })
    .await;
    relay.stop().await;

    let arrived: Vec<(String, u16)> = sink
        .requests()
        .iter()
        .map(|r| {
            (
                r.json()["type"].as_str().unwrap_or("").to_owned(),
                r.answered,
            )
        })
        .collect();
    let arrived: Vec<(&str, u16)> = arrived.iter().map(|(t, s)| (t.as_str(), *s)).collect();
    assert_eq!(
        arrived,
        [
            ("order.placed", 503),
            ("order.placed", 204),
            ("order.paid", 204),
            ("order.shipped", 204),
            ("order.delivered", 204),
        ],
        "default got the order's events in order"
    );
    let behind_unaddressed = (
        Some(unaddressed.clone()),
        Some(endpoint_key(default_id)),
        Some(default_id),
    );
    assert_eq!(
        queued,
        [
            (Some(unaddressed.clone()), None, None),
            behind_unaddressed.clone(),
            behind_unaddressed,
        ],
        "paid and shipped queued behind the unfinished unaddressed delivery"
    );
    assert_eq!(
        after_drain.last(),
        Some(&(
            Some(delivery_key(default_id, order_id)),
            Some(endpoint_key(default_id)),
            Some(default_id),
        )),
        "after the unaddressed key drained: {after_drain:?}"
    );
    assert!(fallback.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_endpoint_gets_no_new_deliveries() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let erp = HttpSink::start([], Answer::status(204)).await;
    let crm = HttpSink::start([], Answer::status(204)).await;
    add_endpoint(&mut conn, "erp", &erp, None, 4);
    let (crm_id, _) = add_endpoint(&mut conn, "crm", &crm, None, 4);
    store::set_enabled(&mut conn, "erp", false).expect("disable");
    place(&mut conn);
    let targets: Vec<serde_json::Value> = jobs_all::table
        .filter(jobs_all::kind.eq("order_webhook"))
        .select(jobs_all::payload)
        .load(&mut conn)
        .expect("jobs");
    assert_eq!(targets.len(), 1);
    assert_eq!(targets[0]["endpoint_id"], json!(crm_id));
}

#[test]
fn jobs_prune_deletes_old_delivery_attempts_and_keeps_recent_ones() {
    let db = TestDb::new();
    let mut conn = db.conn();
    diesel::sql_query(
        "INSERT INTO delivery_attempts \
           (job_id, endpoint_id, attempt, started_at, duration_ms, status_code, outcome) \
         SELECT g, 1, 1, now() - make_interval(days => g), 5, 200, 'ok' \
         FROM generate_series(1, 10) AS g",
    )
    .execute(&mut conn)
    .expect("attempts");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(["jobs", "prune", "--older-than", "7d", "--batch-size", "2"])
        .env("DATABASE_URL", &db.url)
        .output()
        .expect("run jobs prune");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("deleted 4 delivery attempts that started more than 7d ago"),
        "{said}"
    );
    let left: i64 = delivery_attempts::table
        .count()
        .get_result(&mut conn)
        .expect("count");
    assert_eq!(
        left, 6,
        "days 1 to 6 stay; day 7 started just before the cutoff"
    );
}

pub fn failed_webhooks(conn: &mut PgConnection) -> Vec<i64> {
    jobs_all::table
        .filter(jobs_all::kind.eq("order_webhook"))
        .filter(jobs_all::status.eq("failed"))
        .order(jobs_all::id)
        .select(jobs_all::id)
        .load(conn)
        .expect("failed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_redelivers_exactly_the_failed_deliveries_since_then_in_order() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    // The first three calls are refused for good (400): the three placements.
    let erp = HttpSink::start(
        [
            Answer::status(400),
            Answer::status(400),
            Answer::status(400),
        ],
        Answer::status(204),
    )
    .await;
    add_endpoint(&mut conn, "erp", &erp, None, 4);
    let orders: Vec<i64> = (0..3).map(|_| place(&mut conn)).collect();
    for &order in &orders {
        pay(&mut conn, order);
    }
    let relay = delivery_relay(&db, &erp, 4);
    wait_until(
        "the three placements failed",
        Duration::from_secs(30),
        || failed_webhooks(&mut conn).len() == 3,
    )
    .await;
    // Each order's payment waits behind its failed placement.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(erp.requests().len(), 3, "nothing passes a failed head");
    // One of them failed long ago: outside --since.
    let failed = failed_webhooks(&mut conn);
    diesel::sql_query("UPDATE jobs SET finished_at = now() - interval '2 days' WHERE id = $1")
        .bind::<diesel::sql_types::BigInt, _>(failed[0])
        .execute(&mut conn)
        .expect("age one failure");

    let preview = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(["endpoints", "recover", "erp", "--since", "6h", "--dry-run"])
        .env("DATABASE_URL", &db.url)
        .output()
        .expect("recover --dry-run");
    let said = String::from_utf8_lossy(&preview.stdout);
    assert!(
        said.contains("would put back 2 failed deliveries"),
        "{said}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(["endpoints", "recover", "erp", "--since", "6h"])
        .env("DATABASE_URL", &db.url)
        .output()
        .expect("recover");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("put back 2 failed deliveries to erp since"),
        "{said}"
    );
    assert!(
        said.ends_with(&format!("{} {}\n", failed[1], failed[2])),
        "{said}"
    );
    wait_until(
        "the recovered orders are delivered",
        Duration::from_secs(30),
        || done_webhooks(&mut conn) == 4,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    relay.stop().await;
    assert_eq!(
        failed_webhooks(&mut conn),
        vec![failed[0]],
        "the old failure stays failed"
    );

    // Each recovered order: its placement again, then its payment; the
    // order left failed got nothing more.
    let requests = erp.requests();
    assert_eq!(requests.len(), 7, "3 refused + 2 x (placed, paid)");
    let mut by_order: std::collections::HashMap<i64, Vec<String>> = Default::default();
    for request in &requests[3..] {
        let body = request.json();
        let order = body["data"]["order"]["id"].as_i64().expect("order id");
        by_order
            .entry(order)
            .or_default()
            .push(body["type"].as_str().expect("type").to_owned());
    }
    assert_eq!(by_order.len(), 2, "{by_order:?}");
    for types in by_order.values() {
        assert_eq!(types, &["order.placed", "order.paid"]);
    }
}

/// A URL where nothing listens: every call is refused.
async fn dead_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    format!("http://{addr}/hooks/orders")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_endpoint_is_probed_then_disabled_and_enabling_it_delivers_what_waited_in_order() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let erp = HttpSink::start([], Answer::status(204)).await;
    let ops = HttpSink::start([], Answer::status(204)).await;
    let revived = HttpSink::start([], Answer::status(204)).await;
    let (dead_id, _) = add_endpoint(&mut conn, "dead", &revived, None, 4);
    diesel::update(order_service::schema::endpoints::table.find(dead_id))
        .set(order_service::schema::endpoints::url.eq(dead_url().await))
        .execute(&mut conn)
        .expect("point it nowhere");
    add_endpoint(&mut conn, "erp", &erp, Some("order.placed,order.paid"), 4);
    add_endpoint(&mut conn, "ops", &ops, Some("endpoint.disabled"), 4);
    let orders: Vec<i64> = (0..3).map(|_| place(&mut conn)).collect();
    for &order in &orders {
        pay(&mut conn, order);
    }

    // ENDPOINT_DISABLE_AFTER shortened from 5 days to 3 seconds, and
    // ENDPOINT_TRIP_AFTER from 30 s to nothing: the first failure trips it.
    let disable_after = Duration::from_secs(3);
    let relay = delivery_relay_with(
        &db,
        &erp,
        8,
        Breaker {
            disable_after,
            trip_after: Duration::ZERO,
            ..Breaker::default()
        },
    );
    wait_until(
        "the dead endpoint is disabled",
        Duration::from_secs(60),
        || {
            let row: (bool, Option<String>) = order_service::schema::endpoints::table
                .find(dead_id)
                .select((
                    order_service::schema::endpoints::enabled,
                    order_service::schema::endpoints::disabled_reason,
                ))
                .first(&mut conn)
                .expect("row");
            row == (false, Some("failing".to_owned()))
        },
    )
    .await;
    wait_until("ops is told", Duration::from_secs(30), || {
        !ops.requests().is_empty()
    })
    .await;
    // Longer than any probe wait: a paused key lets nothing through.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let calls_to_dead: i64 = delivery_attempts::table
        .filter(delivery_attempts::endpoint_id.eq(dead_id))
        .count()
        .get_result(&mut conn)
        .expect("count");
    eprintln!("calls to the dead endpoint while down: {calls_to_dead}");
    // Up to max_in_flight (4) calls before the first failure is seen and
    // trips the breaker; then one probe at a time after 1 s, 2 s, 4 s (waits
    // double) until the 3 s disable: a handful, not one per delivery per
    // backoff step (6 deliveries, 8 attempts each). The bound is the 9 this
    // test allowed when three failures in a row tripped the breaker.
    let bound = 9;
    assert!(
        (1..=bound).contains(&calls_to_dead),
        "calls to the dead endpoint while down: {calls_to_dead}"
    );
    let notice = ops.requests()[0].json();
    assert_eq!(notice["type"], "endpoint.disabled");
    assert_eq!(notice["data"]["endpoint"]["name"], "dead");
    assert_eq!(notice["data"]["reason"], "failing");
    assert_eq!(ops.requests().len(), 1, "one notice");
    assert_eq!(erp.requests().len(), 6, "erp was never held back");
    let waiting: Vec<String> = jobs_all::table
        .filter(jobs_all::kind.eq("order_webhook"))
        .filter(
            jobs_all::payload
                .retrieve_as_text("endpoint_id")
                .eq(dead_id.to_string()),
        )
        .select(jobs_all::status)
        .load(&mut conn)
        .expect("dead's deliveries");
    assert_eq!(waiting.len(), 6);
    assert!(
        waiting.iter().all(|s| s == "pending"),
        "the disabled endpoint's deliveries wait: {waiting:?}"
    );

    // The receiver is back (at a new address); the operator enables it.
    diesel::update(order_service::schema::endpoints::table.find(dead_id))
        .set(order_service::schema::endpoints::url.eq(revived.url().as_str()))
        .execute(&mut conn)
        .expect("point it at the live receiver");
    store::set_enabled(&mut conn, "dead", true).expect("enable");
    wait_until("what waited is delivered", Duration::from_secs(30), || {
        revived.requests().len() == 6
    })
    .await;
    relay.stop().await;
    let mut by_order: std::collections::HashMap<i64, Vec<String>> = Default::default();
    for request in revived.requests() {
        let body = request.json();
        by_order
            .entry(body["data"]["order"]["id"].as_i64().expect("order id"))
            .or_default()
            .push(body["type"].as_str().expect("type").to_owned());
    }
    for order in &orders {
        assert_eq!(
            by_order[order],
            ["order.placed", "order.paid"],
            "order {order}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rate_limited_endpoint_gets_five_a_second_give_or_take_one_from_two_relays() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = HttpSink::start([], Answer::status(204)).await;
    let (id, _) = add_endpoint(&mut conn, "partner", &sink, None, 16);
    // As `endpoints add --rate-limit 5/s` sets it.
    diesel::update(order_service::schema::endpoints::table.find(id))
        .set(order_service::schema::endpoints::rate_limit.eq(Some(5.0)))
        .execute(&mut conn)
        .expect("rate");
    order_service::endpoints::throttle::sync(&mut conn, id, None).expect("limit");
    // More than the window's worth, queued before the relays start: always a
    // backlog. Ten whole seconds show both the ceiling in every second and
    // the pace on average; a longer window proves nothing more.
    for _ in 0..100 {
        place(&mut conn);
    }
    let relays = [delivery_relay(&db, &sink, 8), delivery_relay(&db, &sink, 8)];
    tokio::time::sleep(Duration::from_secs(12)).await;
    for relay in relays {
        relay.stop().await;
    }
    let arrivals: Vec<i64> = sink.requests().iter().map(|r| r.at.timestamp()).collect();
    let (first, last) = (arrivals[0], arrivals[arrivals.len() - 1]);
    let per_second: Vec<usize> = (first..=last)
        .map(|second| arrivals.iter().filter(|&&at| at == second).count())
        .collect();
    eprintln!("arrivals per second at a 5/s endpoint, two relays: {per_second:?}");
    assert!(
        per_second.len() >= 10,
        "{} seconds observed",
        per_second.len()
    );
    assert!(
        per_second.iter().all(|&n| n <= 6),
        "more than 5+1 in a second: {per_second:?}"
    );
    // The limit, not the relays, sets the pace: whole seconds (not the first
    // or last) average close to 5. (Not each one: on a loaded machine a relay
    // can fall a call behind in one second; the contract is the ceiling.)
    let whole = &per_second[1..per_second.len() - 1];
    let mean = whole.iter().sum::<usize>() as f64 / whole.len() as f64;
    assert!(mean >= 3.5, "{mean:.2}/s on average: {per_second:?}");
}
