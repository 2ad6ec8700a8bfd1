//! What the relay tells subscribers and how it reaches them: notices only to
//! the endpoints that asked for them, and no proxy it was not told to use.

use std::time::Duration;

use chrono::Utc;
use diesel::prelude::*;
use order_service::endpoints::EndpointId;
use order_service::endpoints::attempts::Health;
use order_service::endpoints::breaker::{Breaker, Verdict};
use order_service::schema::jobs_all;

use crate::endpoint_delivery::{add_endpoint, place};
use crate::support::TestDb;
use crate::support::http::{Answer, HttpSink};
use crate::support::process::{BinProcess, Launch};

#[tokio::test]
async fn endpoint_disabled_is_told_only_to_endpoints_that_subscribed_to_it_by_name() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = HttpSink::start([], Answer::status(204)).await;
    let (dead, _) = add_endpoint(&mut conn, "dead", &sink, None, 4);
    // A third party subscribed to every event, and one to order events only.
    let (vendor, _) = add_endpoint(&mut conn, "vendor", &sink, None, 4);
    add_endpoint(&mut conn, "erp", &sink, Some("order.placed"), 4);
    let (ops, _) = add_endpoint(&mut conn, "ops", &sink, Some("endpoint.disabled"), 4);

    let breaker = Breaker {
        disable_after: Duration::from_secs(1),
        ..Breaker::default()
    };
    let since = Utc::now() - chrono::Duration::seconds(2);
    diesel::update(order_service::schema::endpoints::table.find(dead))
        .set(order_service::schema::endpoints::failing_since.eq(since))
        .execute(&mut conn)
        .expect("failing for 2 s");
    let failing = Health {
        failing_since: Some(since),
        changed: false,
    };
    let verdict = breaker
        .after_attempt(&mut conn, EndpointId::new(dead), &failing, Utc::now())
        .expect("breaker");
    assert_eq!(
        verdict,
        Verdict::Disabled {
            endpoint: "dead".into(),
            told: 1
        }
    );
    let told: Vec<i64> = jobs_all::table
        .filter(jobs_all::kind.eq("endpoint_notice"))
        .select(jobs_all::payload.retrieve_as_text("endpoint_id"))
        .load::<String>(&mut conn)
        .expect("notices")
        .into_iter()
        .map(|id| id.parse().expect("an id"))
        .collect();
    assert_eq!(told, [ops], "vendor ({vendor}) subscribed to every event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_ignores_proxy_variables_from_its_environment() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let receiver = HttpSink::start([], Answer::status(204)).await;
    let proxy = HttpSink::start([], Answer::status(204)).await;
    add_endpoint(&mut conn, "erp", &receiver, None, 4);
    let order = place(&mut conn);

    let proxy_url = format!("http://{}", proxy.url().authority());
    let mut launch = Launch::relay("proxy-env", &db.url).env("RELAY_KINDS", "order_webhook");
    for var in [
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
    ] {
        launch = launch.env(var, proxy_url.clone());
    }
    let (mut relay, _) = BinProcess::start_relay(launch).await;
    crate::support::wait_until("the delivery is done", Duration::from_secs(30), || {
        crate::endpoint_delivery::done_webhooks(&mut conn) == 1
    })
    .await;
    relay.terminate().await;
    assert!(
        proxy.requests().is_empty(),
        "the order went through the proxy: {:?}",
        proxy.requests().first().map(|r| r.path.clone())
    );
    let delivered = receiver.requests();
    assert_eq!(delivered.len(), 1);
    assert_eq!(
        delivered[0].json()["data"]["order"]["id"].as_i64(),
        Some(order)
    );
}

#[tokio::test]
async fn adding_an_endpoint_past_the_cap_is_refused_saying_so_and_writes_nothing() {
    use order_service::endpoints::spec::{EndpointName, EndpointUrl, EventTypes, SigningSecret};
    use order_service::endpoints::{NewEndpoint, StoreError, store};
    let db = TestDb::new();
    let mut conn = db.conn();
    let new = |name: &str| NewEndpoint {
        name: EndpointName::parse(name).expect("name"),
        url: EndpointUrl::parse("https://hooks.example.com/in", false).expect("url"),
        event_types: EventTypes::ALL,
        rate_limit: None,
        max_in_flight: 4,
        secret: SigningSecret::generate().expect("secret"),
        nats: None,
    };
    let none = order_service::sealed::Keyring::none();
    store::add_within(&mut conn, &new("one"), 2, &none).expect("first");
    store::add_within(&mut conn, &new("two"), 2, &none).expect("second");
    let refused = store::add_within(&mut conn, &new("three"), 2, &none).expect_err("past the cap");
    assert!(
        matches!(refused, StoreError::TooMany { max: 2 }),
        "{refused}"
    );
    assert!(refused.to_string().contains("ENDPOINTS_MAX"), "{refused}");
    let rows: i64 = order_service::schema::endpoints::table
        .count()
        .get_result(&mut conn)
        .expect("count");
    assert_eq!(rows, 2);
    // The default cap applies to every add.
    for n in 2..store::DEFAULT_MAX_ENDPOINTS {
        store::add(&mut conn, &new(&format!("e{n}")), &none).expect("within the default");
    }
    assert!(matches!(
        store::add(&mut conn, &new("one-too-many"), &none),
        Err(StoreError::TooMany { .. })
    ));
}
