//! Order expiry (`ORDER_PAYMENT_WINDOW`): an order not paid within its
//! window expires once, however many relays sweep, with its event delivered
//! and its email sent; a payment racing the expiry leaves the order paid or
//! expired, never both; a payment after it is held or refused; an order
//! placed without a window never expires.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use order_service::api::ApiSettings;
use order_service::effects::receipt::ReceiptSettings;
use order_service::effects::{self, EffectKind, JobHandler, PeriodicPlan, periodic_jobs};
use order_service::inbox::source::SourceKind;
use order_service::orders::{
    Cause, NewOrder, expire_due_orders, order_enqueuer, place_order, place_order_by,
};
use order_service::schema::{jobs_all, order_events, orders};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::admin::{OPERATOR, admin_settings, http_login, raw_client};
use crate::endpoint_delivery::add_endpoint;
use crate::inbox::{STRIPE_SECRET, add_source, event_types, intent_succeeded, order_status};
use crate::support::app::{TestApp, error_of, spawn_app_with};
use crate::support::http::{Answer, HttpSink};
use crate::support::process::{BinProcess, Launch};
use crate::support::smtp::SmtpSink;
use crate::support::{
    RunningRelay, TestDb, order_json, spawn_relay, test_settings, transition, wait_until,
};

/// The order of `order_json`: 2 × 4.50 + 12.00 EUR.
const TOTAL: i64 = 2_100;

/// The API with the dashboard, placing every order under `window`.
async fn app_with_window(window: Duration) -> TestApp {
    spawn_app_with(ApiSettings {
        payment_window: Some(window),
        ..admin_settings()
    })
    .await
}

async fn place_over_http(app: &TestApp, name: &str) -> Value {
    let response = app.post_order(&order_json(name), None).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    response.json().await.expect("the order as JSON")
}

fn expires_at(conn: &mut PgConnection, order_id: i64) -> Option<DateTime<Utc>> {
    orders::table
        .find(order_id)
        .select(orders::expires_at)
        .first(conn)
        .expect("the order")
}

fn count_events(conn: &mut PgConnection, order_id: i64, event_type: &str) -> i64 {
    order_events::table
        .filter(order_events::order_id.eq(order_id))
        .filter(order_events::event_type.eq(event_type))
        .count()
        .get_result(conn)
        .expect("count events")
}

fn timestamp(value: &Value) -> DateTime<Utc> {
    value
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("a timestamp: {value}"))
}

/// Sleeps until `at` has passed on this machine's clock, which the
/// database server shares.
async fn sleep_until(at: DateTime<Utc>) {
    let wait = (at - Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(20)).await;
}

/// A relay in this process that claims only the expiry sweep and declares
/// it as `relay` does under `ORDER_PAYMENT_WINDOW`.
fn sweeping_relay(db: &TestDb, name: &str) -> RunningRelay {
    relay_with_plan(
        db,
        name,
        PeriodicPlan {
            kinds: vec![EffectKind::OrderExpiry],
            payment_window: true,
            expiry_fallback_every: effects::EXPIRY_FALLBACK_EVERY,
            max_attempts: 8,
            fanout_inline: order_service::orders::DEFAULT_FANOUT_INLINE,
        },
    )
}

fn relay_with_plan(db: &TestDb, name: &str, plan: PeriodicPlan) -> RunningRelay {
    let mut settings = test_settings(name, &[EffectKind::OrderExpiry.as_str()]);
    settings.periodic_jobs = periodic_jobs(&plan).expect("valid periodic jobs");
    settings.periodic_enqueuer = order_enqueuer();
    let workers: Arc<dyn JobHandler> = Arc::new(effects::workers(
        db.pool(6),
        None,
        None,
        ReceiptSettings::default(),
    ));
    spawn_relay(db, settings, workers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpaid_order_expires_once_with_two_relays_and_its_event_and_email_go_out() {
    let app = app_with_window(Duration::from_secs(1)).await;
    let mut conn = app.db.conn();
    let receiver = HttpSink::start([], Answer::status(204)).await;
    add_endpoint(&mut conn, "erp", &receiver, None, 4);
    let smtp = SmtpSink::start().await;
    let relay = |name: &str| {
        Launch::relay(name, &app.db.url)
            .env("SMTP_URL", smtp.url())
            .env("ORDER_PAYMENT_WINDOW", "1s")
    };
    let (mut first, _) = BinProcess::start_relay(relay("expiry-a")).await;
    let (mut second, _) = BinProcess::start_relay(relay("expiry-b")).await;

    let unpaid = place_over_http(&app, "Ada Unpaid").await;
    let unpaid_id = unpaid["id"].as_i64().expect("id");
    assert_eq!(unpaid["status"], "placed");
    assert_eq!(
        timestamp(&unpaid["expires_at"]) - timestamp(&unpaid["created_at"]),
        chrono::Duration::seconds(1),
        "expires_at is created_at plus the window: {unpaid}"
    );
    let paid_id = place_over_http(&app, "Ada Paid").await["id"]
        .as_i64()
        .expect("id");
    transition(
        &mut conn,
        paid_id,
        "pay",
        json!({"payment_reference": "pi_1"}),
    );
    assert_eq!(
        expires_at(&mut conn, paid_id),
        None,
        "pay clears expires_at"
    );
    // As `serve` places with ORDER_PAYMENT_WINDOW=off: no expires_at.
    let order = NewOrder::parse(&order_json("Ada Windowless")).expect("valid");
    let windowless = place_order(&mut conn, &order_enqueuer(), &order, None, 8)
        .expect("placed")
        .order_id();
    assert_eq!(expires_at(&mut conn, windowless), None);

    wait_until(
        "the unpaid order's expiry email and delivery",
        Duration::from_secs(20),
        || {
            let delivered = receiver
                .requests()
                .iter()
                .any(|r| r.json()["type"] == "order.expired");
            let mailed = smtp.accepted().iter().any(|m| {
                m.header("Subject").as_deref()
                    == Some(format!("Your order #{unpaid_id} has expired unpaid").as_str())
            });
            delivered && mailed
        },
    )
    .await;
    // A few more sweeps by both relays change nothing.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    first.terminate().await;
    second.terminate().await;

    assert_eq!(order_status(&app, unpaid_id), "expired");
    assert_eq!(expires_at(&mut conn, unpaid_id), None);
    assert_eq!(
        event_types(&app, unpaid_id),
        ["order.placed", "order.expired"]
    );
    let expired: Vec<Value> = receiver
        .requests()
        .iter()
        .map(|r| r.json())
        .filter(|body| body["type"] == "order.expired")
        .collect();
    assert_eq!(expired.len(), 1, "one delivery of one event: {expired:?}");
    assert_eq!(expired[0]["data"]["order"]["id"], unpaid_id);
    assert_eq!(
        timestamp(&expired[0]["data"]["expires_at"]),
        timestamp(&unpaid["expires_at"])
    );
    let mails: Vec<_> = smtp
        .accepted()
        .into_iter()
        .filter(|m| m.header("Subject").is_some_and(|s| s.contains("expired")))
        .collect();
    assert_eq!(mails.len(), 1, "one expiry email");
    let text = mails[0].part("text/plain").expect("a text part");
    assert!(text.contains("has expired"), "{text}");
    let html = mails[0].part("text/html").expect("an HTML part");
    assert!(html.contains("has expired"), "{html}");
    // The paid order and the one without a window were left alone.
    assert_eq!(order_status(&app, paid_id), "paid");
    assert_eq!(order_status(&app, windowless), "placed");
    assert_eq!(event_types(&app, windowless), ["order.placed"]);
    // Every sweep was a job of its own, none failed.
    let sweeps: Vec<String> = jobs_all::table
        .filter(jobs_all::kind.eq("order_expiry"))
        .select(jobs_all::status)
        .load(&mut conn)
        .expect("sweep jobs");
    assert!(sweeps.len() >= 2, "{sweeps:?}");
    assert!(sweeps.iter().all(|s| s == "done"), "{sweeps:?}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_racing_the_expiry_leaves_each_order_paid_or_expired_never_both() {
    const ORDERS: usize = 40;
    let app = spawn_app_with(ApiSettings {
        payment_window: Some(Duration::from_secs(1)),
        ..crate::support::app::test_api_settings()
    })
    .await;
    let relays = [
        sweeping_relay(&app.db, "sweeper-a"),
        sweeping_relay(&app.db, "sweeper-b"),
    ];
    let mut placed = Vec::new();
    for n in 0..ORDERS {
        let order = place_over_http(&app, &format!("Racer {n}")).await;
        placed.push((
            order["id"].as_i64().expect("id"),
            timestamp(&order["expires_at"]),
        ));
    }
    // The payments from 0.3 s before each order's expires_at to 1.8 s after
    // it, 60 ms apart: the relays' sweeps, one a second, fall among them, so
    // the earliest find their order placed, the latest find it expired, and
    // those around a sweep race it for the row.
    let payments = placed.iter().enumerate().map(|(n, &(id, due))| {
        let client = app.client.clone();
        let url = app.url(&format!("/orders/{id}/pay"));
        let offset = 60 * i64::try_from(n % 36).expect("small") - 300;
        let at = due + chrono::Duration::milliseconds(offset);
        async move {
            sleep_until(at).await;
            let response = client
                .post(url)
                .json(&json!({"payment_reference": format!("pi_race_{id}")}))
                .send()
                .await
                .expect("POST pay");
            (id, response)
        }
    });
    let answers = futures_util::future::join_all(payments).await;
    // Let the last sweeps run before looking.
    sleep_until(placed.last().map(|p| p.1).expect("orders") + chrono::Duration::seconds(2)).await;
    for relay in relays {
        relay.stop().await;
    }

    let mut conn = app.db.conn();
    let (mut paid, mut expired) = (0, 0);
    for (id, response) in answers {
        let status = order_status(&app, id);
        let events = event_types(&app, id);
        match status.as_str() {
            "paid" => {
                paid += 1;
                assert_eq!(response.status(), StatusCode::OK, "order {id}");
                assert_eq!(events, ["order.placed", "order.paid"], "order {id}");
            }
            "expired" => {
                expired += 1;
                let error = error_of(response, StatusCode::CONFLICT).await;
                assert_eq!(error["code"], "invalid_transition", "order {id}: {error}");
                assert_eq!(events, ["order.placed", "order.expired"], "order {id}");
            }
            other => panic!("order {id} is {other}"),
        }
        assert_eq!(expires_at(&mut conn, id), None, "order {id}");
    }
    eprintln!("of {ORDERS} orders paid around their expiry: {paid} paid, {expired} expired");
    assert_eq!(paid + expired, ORDERS);
    assert!(
        paid > 0 && expired > 0,
        "payments spread over 2.1 s around one-second sweeps meet both outcomes: \
         {paid} paid, {expired} expired"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_after_the_expiry_is_held_from_the_inbox_and_refused_by_the_api() {
    let app = app_with_window(Duration::from_secs(1)).await;
    add_source(&app, "stripe", SourceKind::Stripe, STRIPE_SECRET);
    let order = place_over_http(&app, "Ada Late").await;
    let id = order["id"].as_i64().expect("id");
    sleep_until(timestamp(&order["expires_at"])).await;
    let mut conn = app.db.conn();
    let sweep = expire_due_orders(&mut conn, &order_enqueuer(), 8, 100).expect("a sweep");
    assert_eq!(sweep.expired, [id]);
    assert!(sweep.failed.is_empty());

    let late = intent_succeeded("evt_late", json!(id.to_string()), TOTAL, "eur", "pi_late");
    assert_eq!(crate::inbox::stripe(&app, &late).await, "held");
    let (status, reason) = crate::inbox::stored(&app, "evt_late");
    assert_eq!(status, "held");
    let reason = reason.expect("a reason");
    assert!(
        reason.starts_with("paid after the order expired: refund needed"),
        "{reason}"
    );
    assert!(reason.contains("pi_late"), "{reason}");

    let refused = app
        .client
        .post(app.url(&format!("/orders/{id}/pay")))
        .json(&json!({"payment_reference": "pi_api"}))
        .send()
        .await
        .expect("POST pay");
    let error = error_of(refused, StatusCode::CONFLICT).await;
    assert_eq!(error["code"], "invalid_transition", "{error}");
    assert_eq!(order_status(&app, id), "expired");
    assert_eq!(event_types(&app, id), ["order.placed", "order.expired"]);
    // A second sweep finds nothing.
    let again = expire_due_orders(&mut conn, &order_enqueuer(), 8, 100).expect("a sweep");
    assert!(again.expired.is_empty());

    // The API and the dashboard show it expired, with its event.
    let shown: Value = app
        .get(&format!("/orders/{id}"))
        .await
        .json()
        .await
        .expect("the order");
    assert_eq!(shown["status"], "expired");
    assert_eq!(shown["expires_at"], Value::Null);
    assert_eq!(shown["events"][1]["type"], "order.expired");
    assert_eq!(
        timestamp(&shown["events"][1]["data"]["expires_at"]),
        timestamp(&order["expires_at"])
    );
    let client = raw_client();
    let (cookie, _) = http_login(&client, &app, OPERATOR).await;
    let page = |id: i64| {
        let (client, cookie) = (client.clone(), cookie.clone());
        let url = app.url(&format!("/admin/orders/{id}"));
        async move {
            client
                .get(url)
                .header("cookie", cookie)
                .send()
                .await
                .expect("GET the order page")
                .text()
                .await
                .expect("the page")
        }
    };
    let expired_page = page(id).await;
    assert!(
        expired_page.contains(r#"<span class="status expired">expired</span>"#),
        "{expired_page}"
    );
    assert!(
        expired_page.contains("order.expired (event 2)"),
        "{expired_page}"
    );
    let waiting = place_over_http(&app, "Ada Waiting").await;
    let waiting_page = page(waiting["id"].as_i64().expect("id")).await;
    assert!(
        waiting_page.contains("<dt>Expires</dt>") && waiting_page.contains("unless paid"),
        "{waiting_page}"
    );
    app.stop().await;
}

#[tokio::test]
async fn without_a_window_an_order_never_expires_and_leaving_placed_clears_expires_at() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let order = NewOrder::parse(&order_json("Ada")).expect("valid");
    let place = |conn: &mut PgConnection, window: Option<Duration>| {
        place_order_by(
            conn,
            &order_enqueuer(),
            &order,
            None,
            8,
            Cause::default(),
            window,
        )
        .expect("placed")
        .order_id()
    };
    let windowless = place(&mut conn, None);
    let to_pay = place(&mut conn, Some(Duration::from_secs(1)));
    let to_cancel = place(&mut conn, Some(Duration::from_secs(1)));
    assert_eq!(expires_at(&mut conn, windowless), None);
    assert!(expires_at(&mut conn, to_pay).is_some());
    transition(
        &mut conn,
        to_pay,
        "pay",
        json!({"payment_reference": "pi_1"}),
    );
    transition(
        &mut conn,
        to_cancel,
        "cancel",
        json!({"reason": "changed mind"}),
    );
    assert_eq!(expires_at(&mut conn, to_pay), None);
    assert_eq!(expires_at(&mut conn, to_cancel), None);

    tokio::time::sleep(Duration::from_millis(1100)).await;
    let sweep = expire_due_orders(&mut conn, &order_enqueuer(), 8, 100).expect("a sweep");
    assert!(sweep.expired.is_empty(), "{:?}", sweep.expired);
    for (id, status) in [
        (windowless, "placed"),
        (to_pay, "paid"),
        (to_cancel, "cancelled"),
    ] {
        let now: String = orders::table
            .find(id)
            .select(orders::status)
            .first(&mut conn)
            .expect("order");
        assert_eq!(now, status, "order {id}");
        assert_eq!(count_events(&mut conn, id, "order.expired"), 0);
    }
    // The schema holds it too: a non-placed order cannot keep an expires_at.
    let kept = diesel::sql_query("UPDATE orders SET expires_at = now() WHERE id = $1")
        .bind::<diesel::sql_types::BigInt, _>(to_pay)
        .execute(&mut conn);
    let error = kept.expect_err("refused by the CHECK");
    assert!(
        error
            .to_string()
            .contains("orders_expires_only_while_placed"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_started_without_the_window_expires_orders_placed_under_one_later() {
    let db = TestDb::new();
    let mut conn = db.conn();
    // The relay comes first, with nothing awaiting expiry; the API that
    // places under a window comes later.
    let relay = relay_with_plan(
        &db,
        "expiry-off",
        PeriodicPlan {
            kinds: vec![EffectKind::OrderExpiry],
            payment_window: false,
            expiry_fallback_every: Duration::from_secs(1),
            max_attempts: 8,
            fanout_inline: order_service::orders::DEFAULT_FANOUT_INLINE,
        },
    );
    let order = NewOrder::parse(&order_json("Ada")).expect("valid");
    let id = place_order_by(
        &mut conn,
        &order_enqueuer(),
        &order,
        None,
        8,
        Cause::default(),
        Some(Duration::from_secs(1)),
    )
    .expect("placed")
    .order_id();
    wait_until("the order expires", Duration::from_secs(15), || {
        count_events(&mut conn, id, "order.expired") == 1
    })
    .await;
    relay.stop().await;
    let status: String = orders::table
        .find(id)
        .select(orders::status)
        .first(&mut conn)
        .expect("order");
    assert_eq!(status, "expired");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_command_sweeps_every_second_under_a_window_and_every_minute_without() {
    let db = TestDb::new();
    let mut conn = db.conn();
    for (name, window, expected) in [
        (
            "expiry-off",
            None,
            (effects::EXPIRY_FALLBACK_NAME, "every 1m"),
        ),
        ("expiry-on", Some("15m"), ("order_expiry", "every 1s")),
    ] {
        let mut launch = Launch::relay(name, &db.url).env("RELAY_KINDS", "order_expiry");
        launch = match window {
            Some(window) => launch.env("ORDER_PAYMENT_WINDOW", window),
            None => launch.without_env("ORDER_PAYMENT_WINDOW"),
        };
        let (mut relay, _) = BinProcess::start_relay(launch).await;
        relay.terminate().await;
        let declared: Vec<(String, String, String)> =
            diesel::sql_query("SELECT name, schedule, kind FROM periodic_jobs WHERE name = $1")
                .bind::<diesel::sql_types::Text, _>(expected.0)
                .load::<Declared>(&mut conn)
                .expect("periodic_jobs")
                .into_iter()
                .map(|d| (d.name, d.schedule, d.kind))
                .collect();
        assert_eq!(
            declared,
            [(
                expected.0.to_owned(),
                expected.1.to_owned(),
                "order_expiry".to_owned()
            )],
            "{}",
            relay.stderr()
        );
    }
}

#[derive(QueryableByName)]
struct Declared {
    #[diesel(sql_type = diesel::sql_types::Text)]
    name: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    schedule: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    kind: String,
}
