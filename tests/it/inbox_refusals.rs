//! `POST /inbound/{source}`'s front door (issue 47): every refusal is one
//! 401 body, decided before the request takes a database connection, and
//! spends the address's budget; a request head over 32 KiB is refused before
//! any handler; sources come from a snapshot at most its TTL old, and a
//! rotation's previous secret ends at its expiry.

use std::time::{Duration, Instant};

use diesel::prelude::*;
use order_service::api::{ApiSettings, RateLimit};
use order_service::client_addr::TrustedProxies;
use order_service::inbox::source::{self, SourceKind};
use order_service::inbox::source_cache::SOURCE_CACHE_TTL;
use order_service::inbox::verify::stripe_signature;
use order_service::sealed::Keyring;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::inbox::{
    STANDARD_SECRET, STRIPE_SECRET, add_source, intent_succeeded, now, stripe_event,
};
use crate::support::app::{TestApp, spawn_app, spawn_app_with, test_api_settings};

/// How late past the cache's TTL a change may be seen: the request that
/// refreshes it, on a busy machine.
const SLACK: Duration = Duration::from_millis(1500);

/// Every 401 of `/inbound`, byte for byte (DESIGN.md, "Inbox").
const REFUSED: &str = r#"{"error":{"code":"unauthorized"}}"#;

fn stored_count(app: &TestApp) -> i64 {
    order_service::schema::inbox_messages::table
        .count()
        .get_result(&mut app.db.conn())
        .expect("count")
}

/// A Standard Webhooks signature of `body` under `secret` (a `whsec_` one).
fn standard_signature(secret: &str, id: &str, ts: i64, body: &[u8]) -> String {
    order_service::effects::signature::Secrets::parse(secret)
        .expect("a whsec_ secret")
        .sign_v1(id, ts, body)
}

/// A request to `/inbound/{source}` with `headers`, as a provider or an
/// attacker sends it.
async fn post(
    app: &TestApp,
    source: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> reqwest::Response {
    let mut request = crate::support::app::http_client()
        .post(app.url(&format!("/inbound/{source}")))
        .header("content-type", "application/json")
        .body(body.to_vec());
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    request.send().await.expect("POST /inbound")
}

async fn stripe_signed(app: &TestApp, secret: &str, event: &str) -> StatusCode {
    let body = stripe_event(event, "customer.created", json!({}));
    let signature = stripe_signature(secret, now(), &body);
    post(app, "stripe", &[("stripe-signature", signature)], &body)
        .await
        .status()
}

/// One refused request: what is wrong with it, its source, its headers.
type Refusal = (&'static str, &'static str, Vec<(&'static str, String)>);

/// Every way a message can be refused, for a Stripe source `stripe` and a
/// Standard Webhooks source `billing`.
fn refusals(body: &[u8]) -> Vec<Refusal> {
    let good_stripe = stripe_signature(STRIPE_SECRET, now(), body);
    let good_standard = standard_signature(STANDARD_SECRET, "msg_r", now(), body);
    vec![
        (
            "an unknown source",
            "paypal",
            vec![("stripe-signature", good_stripe.clone())],
        ),
        ("no Stripe-Signature", "stripe", vec![]),
        (
            "a wrong Stripe secret",
            "stripe",
            vec![(
                "stripe-signature",
                stripe_signature("whsec_not_the_secret_at_all", now(), body),
            )],
        ),
        (
            "a stale Stripe timestamp",
            "stripe",
            vec![(
                "stripe-signature",
                stripe_signature(STRIPE_SECRET, now() - 301, body),
            )],
        ),
        (
            "eleven Stripe signatures, the right one first",
            "stripe",
            vec![(
                "stripe-signature",
                format!("{good_stripe}{}", ",v1=00".repeat(10)),
            )],
        ),
        (
            "no webhook-id",
            "billing",
            vec![
                ("webhook-timestamp", now().to_string()),
                ("webhook-signature", good_standard.clone()),
            ],
        ),
        (
            "a future webhook-timestamp",
            "billing",
            vec![
                ("webhook-id", "msg_r".into()),
                ("webhook-timestamp", (now() + 301).to_string()),
                ("webhook-signature", good_standard.clone()),
            ],
        ),
        (
            "a wrong Standard signature",
            "billing",
            vec![
                ("webhook-id", "msg_other".into()),
                ("webhook-timestamp", now().to_string()),
                ("webhook-signature", good_standard.clone()),
            ],
        ),
        (
            "eleven Standard signatures, the right one first",
            "billing",
            vec![
                ("webhook-id", "msg_r".into()),
                ("webhook-timestamp", now().to_string()),
                (
                    "webhook-signature",
                    format!("{good_standard}{}", " v1,".repeat(10)),
                ),
            ],
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_inbound_refusal_is_the_same_401_and_takes_no_database_connection() {
    // One connection, which a blocked POST /orders holds below: anything
    // that needs it waits db_wait (2 s) and is answered 503.
    let app = spawn_app_with(ApiSettings {
        pool_size: 1,
        // The snapshot read below outlives the test.
        source_cache_ttl: Duration::from_secs(600),
        ..test_api_settings()
    })
    .await;
    add_source(&app, "stripe", SourceKind::Stripe, STRIPE_SECRET);
    add_source(&app, "billing", SourceKind::Standard, STANDARD_SECRET);
    let body = intent_succeeded("evt_r", json!("1"), 2_100, "eur", "pi_r");
    // Reads the snapshot of sources.
    assert_eq!(
        stripe_signed(&app, STRIPE_SECRET, "evt_warm").await,
        StatusCode::OK
    );

    let mut locker = app.db.conn();
    diesel::sql_query("BEGIN")
        .execute(&mut locker)
        .expect("begin");
    diesel::sql_query("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
        .execute(&mut locker)
        .expect("lock");
    let blocked = {
        let (client, url) = (app.client.clone(), app.url("/orders"));
        let order = crate::support::order_json("Ada");
        tokio::spawn(async move { client.post(url).json(&order).send().await })
    };
    let mut watcher = app.db.conn();
    crate::support::wait_until(
        "POST /orders waits on the lock, holding the only connection",
        Duration::from_secs(10),
        || {
            #[derive(QueryableByName)]
            struct Waiting {
                #[diesel(sql_type = diesel::sql_types::BigInt)]
                n: i64,
            }
            diesel::sql_query(
                "SELECT count(*) AS n FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .get_result::<Waiting>(&mut watcher)
            .map(|w| w.n > 0)
            .unwrap_or(false)
        },
    )
    .await;

    for (what, source, headers) in refusals(&body) {
        let started = Instant::now();
        let response = post(&app, source, &headers, &body).await;
        let took = started.elapsed();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{what}");
        assert!(
            response.headers().get("www-authenticate").is_none(),
            "{what}: no Bearer challenge on a signed route"
        );
        let text = response.text().await.expect("body");
        assert_eq!(text, REFUSED, "{what}");
        // One that needed the connection would wait db_wait (2 s) for it,
        // then be answered 503.
        assert!(
            took < Duration::from_secs(2),
            "{what}: {took:?}, so it waited for the connection"
        );
    }
    diesel::sql_query("ROLLBACK")
        .execute(&mut locker)
        .expect("rollback");
    let _ = blocked.await;
    assert_eq!(stored_count(&app), 1, "only the warm-up message");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbound_refusals_spend_the_address_s_budget_of_failed_requests() {
    let mut settings = test_api_settings();
    settings.address_limit = Some("3/m".parse::<RateLimit>().expect("valid"));
    settings.trusted_proxies = TrustedProxies::parse("127.0.0.1/32").expect("valid");
    let app = spawn_app_with(settings).await;
    add_source(&app, "stripe", SourceKind::Stripe, STRIPE_SECRET);
    let body = stripe_event("evt_b", "customer.created", json!({}));
    let wrong = stripe_signature("whsec_not_the_secret_at_all", now(), &body);
    let from = |address: &str| ("x-forwarded-for", address.to_owned());
    for _ in 0..3 {
        let response = post(
            &app,
            "stripe",
            &[("stripe-signature", wrong.clone()), from("203.0.113.9")],
            &body,
        )
        .await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    }
    // Spent: even a good signature from that address waits now.
    let right = stripe_signature(STRIPE_SECRET, now(), &body);
    let refused = post(
        &app,
        "stripe",
        &[("stripe-signature", right.clone()), from("203.0.113.9")],
        &body,
    )
    .await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let other = post(
        &app,
        "stripe",
        &[("stripe-signature", right), from("203.0.113.10")],
        &body,
    )
    .await;
    assert_eq!(other.status(), StatusCode::OK, "another address's budget");
    app.stop().await;
}

/// `POST path` with `body` and an `x-pad` header that makes the request's
/// head `head_bytes` long, over a raw connection; the answer's text.
async fn raw_post_with_head_of(
    app: &TestApp,
    path: &str,
    extra: &str,
    body: &[u8],
    head_bytes: usize,
) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let start = format!(
        "POST {path} HTTP/1.1\r\nhost: shop.example\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n{extra}",
        body.len()
    );
    let padding = head_bytes - start.len() - "x-pad: \r\n\r\n".len();
    let head = format!("{start}x-pad: {}\r\n\r\n", "a".repeat(padding));
    assert_eq!(head.len(), head_bytes);
    let mut stream = tokio::net::TcpStream::connect(app.addr)
        .await
        .expect("connect");
    // A server that refuses the head may close before taking it all.
    if stream.write_all(head.as_bytes()).await.is_ok() {
        let _ = stream.write_all(body).await;
    }
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_over_32_kib_is_refused_431_before_any_handler() {
    let app = spawn_app().await;
    add_source(&app, "stripe", SourceKind::Stripe, STRIPE_SECRET);
    add_source(&app, "billing", SourceKind::Standard, STANDARD_SECRET);
    let stripe_body = stripe_event("evt_h", "customer.created", json!({}));
    let signed = |body: &[u8]| {
        format!(
            "stripe-signature: {}\r\n",
            stripe_signature(STRIPE_SECRET, now(), body)
        )
    };

    let over = raw_post_with_head_of(
        &app,
        "/inbound/stripe",
        &signed(&stripe_body),
        &stripe_body,
        32 * 1024 + 1,
    )
    .await;
    assert!(over.starts_with("HTTP/1.1 431 "), "{over}");
    let json = over.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    let error: Value = serde_json::from_str(json).expect("a JSON body");
    assert_eq!(error["error"]["code"], "header_fields_too_large", "{error}");
    assert_eq!(stored_count(&app), 0, "no handler ran");
    // The same before the key check of /orders: no order, no 401.
    let order = serde_json::to_vec(&crate::support::order_json("Ada")).expect("JSON");
    let over = raw_post_with_head_of(
        &app,
        "/orders",
        &format!("authorization: Bearer {}\r\n", app.api_key),
        &order,
        32 * 1024 + 1,
    )
    .await;
    assert!(over.starts_with("HTTP/1.1 431 "), "{over}");
    assert_eq!(app.rows().orders, 0);
    // Far over: refused at hyper's buffer, the connection closed.
    let far = raw_post_with_head_of(
        &app,
        "/inbound/stripe",
        &signed(&stripe_body),
        &stripe_body,
        400 * 1024,
    )
    .await;
    assert!(far.is_empty() || far.starts_with("HTTP/1.1 431 "), "{far}");
    assert_eq!(stored_count(&app), 0);

    // Just under the limit, and as providers send them: served.
    let under = raw_post_with_head_of(
        &app,
        "/inbound/stripe",
        &signed(&stripe_body),
        &stripe_body,
        32 * 1024,
    )
    .await;
    assert!(under.starts_with("HTTP/1.1 200 "), "{under}");
    assert_eq!(
        stripe_signed(&app, STRIPE_SECRET, "evt_h2").await,
        StatusCode::OK
    );
    let body = br#"{"type":"customer.created","data":{}}"#;
    let ts = now();
    let standard = post(
        &app,
        "billing",
        &[
            ("webhook-id", "msg_h".into()),
            ("webhook-timestamp", ts.to_string()),
            (
                "webhook-signature",
                standard_signature(STANDARD_SECRET, "msg_h", ts, body),
            ),
        ],
        body,
    )
    .await;
    assert_eq!(standard.status(), StatusCode::OK);
    assert_eq!(stored_count(&app), 3);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_takes_effect_within_the_cache_ttl_and_the_previous_secret_ends_at_its_expiry() {
    let app = spawn_app().await;
    add_source(&app, "stripe", SourceKind::Stripe, STRIPE_SECRET);
    assert_eq!(
        stripe_signed(&app, STRIPE_SECRET, "evt_0").await,
        StatusCode::OK
    );

    // A new secret; the old one kept for 8 s.
    let new_secret = "whsec_the_rotated_secret_0001";
    let keep_old = Duration::from_secs(8);
    let rotated_at = Instant::now();
    let rotated = source::rotate_secret(
        &mut app.db.conn(),
        "stripe",
        new_secret,
        keep_old,
        &Keyring::none(),
    )
    .expect("rotate");
    let expires_at = rotated
        .previous_secret_expires_at
        .expect("the old secret is kept");
    let mut tries = 0;
    while stripe_signed(&app, new_secret, &format!("evt_new_{tries}")).await != StatusCode::OK {
        assert!(
            rotated_at.elapsed() <= SOURCE_CACHE_TTL + SLACK,
            "the new secret still refused {:?} after the rotation",
            rotated_at.elapsed()
        );
        tries += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        rotated_at.elapsed() < keep_old - Duration::from_secs(2),
        "too slow to see the old secret's window"
    );
    assert_eq!(
        stripe_signed(&app, STRIPE_SECRET, "evt_old_during").await,
        StatusCode::OK,
        "the previous secret verifies until it expires"
    );
    // Past its expiry: refused at once, whatever the snapshot's age.
    let until_expiry = (expires_at - chrono::Utc::now())
        .to_std()
        .unwrap_or_default();
    tokio::time::sleep(until_expiry + Duration::from_millis(200)).await;
    let after = post(
        &app,
        "stripe",
        &[(
            "stripe-signature",
            stripe_signature(
                STRIPE_SECRET,
                now(),
                &stripe_event("evt_old_after", "customer.created", json!({})),
            ),
        )],
        &stripe_event("evt_old_after", "customer.created", json!({})),
    )
    .await;
    assert_eq!(after.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(after.text().await.expect("body"), REFUSED);
    assert_eq!(
        stripe_signed(&app, new_secret, "evt_new_after").await,
        StatusCode::OK
    );

    // A source added while serving: known within the TTL.
    let added_at = Instant::now();
    add_source(&app, "billing", SourceKind::Standard, STANDARD_SECRET);
    let body = br#"{"type":"customer.created","data":{}}"#;
    loop {
        let ts = now();
        let id = format!("msg_{}", added_at.elapsed().as_millis());
        let answer = post(
            &app,
            "billing",
            &[
                ("webhook-id", id.clone()),
                ("webhook-timestamp", ts.to_string()),
                (
                    "webhook-signature",
                    standard_signature(STANDARD_SECRET, &id, ts, body),
                ),
            ],
            body,
        )
        .await;
        if answer.status() == StatusCode::OK {
            break;
        }
        assert!(
            added_at.elapsed() <= SOURCE_CACHE_TTL + SLACK,
            "the new source still unknown {:?} after it was added",
            added_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.stop().await;
}
