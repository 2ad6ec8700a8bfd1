//! The front door before the handlers: the key is verified before the body
//! is read, an address that keeps failing is refused before authentication,
//! `/healthz` asks the database nothing per call, metrics stay off the public
//! port, and `orders:read:own` reads only its own orders.

use std::time::{Duration, Instant};

use diesel::prelude::*;
use order_service::api::RateLimit;
use order_service::api_keys::{NewSecret, Scope};
use order_service::client_addr::TrustedProxies;
use order_service::schema::{api_keys, order_events, orders};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::support::app::{
    TestApp, create_api_key, error_of, http_client, http_client_with_key, spawn_app,
    spawn_app_with, test_api_settings,
};
use crate::support::order_json;

/// A key of the right form and checksum that no database holds.
fn made_up_key() -> String {
    NewSecret::generate().expect("random").expose().to_owned()
}

/// Sends `POST /orders` with a made-up key and `Content-Length:
/// content_length`, and no body; the start of the answer, which must come
/// within 2 seconds.
async fn answer_to_a_head_without_its_body(app: &TestApp, content_length: usize) -> String {
    let mut stream = TcpStream::connect(app.addr).await.expect("connect");
    let head = format!(
        "POST /orders HTTP/1.1\r\nHost: shop.example\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {content_length}\r\n\r\n",
        made_up_key(),
    );
    stream
        .write_all(head.as_bytes())
        .await
        .expect("send the head");
    // The body never comes: the answer must not wait for it.
    let mut answer = vec![0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut answer))
        .await
        .expect("an answer within 2s, not after the request timeout")
        .expect("read");
    String::from_utf8_lossy(&answer[..read]).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_made_up_key_with_a_60_kib_content_length_and_no_body_is_refused_at_once() {
    let app = spawn_app().await;
    let started = Instant::now();
    let answer = answer_to_a_head_without_its_body(&app, 60 * 1024).await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(answer.contains("\"unauthorized\""), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(2));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_keys_never_see_400_413_415_or_422() {
    let app = spawn_app().await;
    let order = app.post_order(&order_json("Ada"), None).await;
    assert_eq!(order.status(), StatusCode::CREATED);
    let client = http_client_with_key(&made_up_key());
    let mut bad_fields = order_json("Ada");
    bad_fields["currency"] = json!("???");
    let requests = [
        // 415 with a known key: no JSON content type.
        client
            .post(app.url("/orders"))
            .header("content-type", "text/plain")
            .body("{}"),
        // 400: not JSON.
        client
            .post(app.url("/orders"))
            .header("content-type", "application/json")
            .body("{\"customer\":"),
        // 400: a bad Idempotency-Key.
        client
            .post(app.url("/orders"))
            .header("idempotency-key", "has space")
            .json(&order_json("Ada")),
        // 422: a field that is wrong.
        client.post(app.url("/orders")).json(&bad_fields),
        // A transition's body, and a path that names no order.
        client
            .post(app.url("/orders/1/ship"))
            .json(&json!({"carrier": 7})),
        client.get(app.url("/orders/not-a-number")),
        client.get(app.url("/orders/1/receipt.pdf")),
    ];
    for request in requests {
        let response = request.send().await.expect("send");
        let error = error_of(response, StatusCode::UNAUTHORIZED).await;
        assert_eq!(error["code"], "unauthorized", "{error}");
    }
    // 413 with a known key: a body over the limit (announced, never sent).
    let answer = answer_to_a_head_without_its_body(&app, 70 * 1024).await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    app.stop().await;
}

/// Settings whose per-address limit is `limit`, behind a proxy on loopback:
/// each request's `X-Forwarded-For` says which client it comes from.
async fn spawn_app_behind_proxy(limit: &str) -> TestApp {
    let mut settings = test_api_settings();
    settings.address_limit = Some(limit.parse::<RateLimit>().expect("valid"));
    settings.trusted_proxies = TrustedProxies::parse("127.0.0.1/32").expect("valid");
    spawn_app_with(settings).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_that_keeps_failing_is_refused_before_authentication_and_valid_keys_are_not_counted()
 {
    let app = spawn_app_behind_proxy("5/m").await;
    let made_up = http_client_with_key(&made_up_key());
    let get = |client: &reqwest::Client, from: &str| {
        client
            .get(app.url("/orders/1"))
            .header("x-forwarded-for", from)
            .send()
    };

    for _ in 0..5 {
        let response = get(&made_up, "203.0.113.9").await.expect("send");
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    }
    // Spent: refused before the key is looked up, with when to come back.
    let refused = get(&made_up, "203.0.113.9").await.expect("send");
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .expect("ASCII")
        .parse()
        .expect("seconds");
    assert!((1..=12).contains(&retry_after), "{retry_after}");
    let error = error_of(refused, StatusCode::TOO_MANY_REQUESTS).await;
    assert_eq!(error["code"], "rate_limited");
    // No key at all counts the same.
    let anonymous = http_client()
        .get(app.url("/orders/1"))
        .header("x-forwarded-for", "203.0.113.9")
        .send()
        .await
        .expect("send");
    assert_eq!(anonymous.status(), StatusCode::TOO_MANY_REQUESTS);

    // Another address has its own budget; a valid key never spends it, even
    // when its answers are 404s.
    for _ in 0..20 {
        let response = get(&app.client, "203.0.113.10").await.expect("send");
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
    }
    let response = get(&made_up, "203.0.113.10").await.expect("send");
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);

    // Loopback (no proxy header: the peer itself) is never limited.
    for _ in 0..20 {
        let response = made_up
            .get(app.url("/orders/1"))
            .send()
            .await
            .expect("send");
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unproxied_client_cannot_pose_as_another_address() {
    // Without TRUSTED_PROXIES the header is the client's own word: ignored,
    // so the peer (loopback here) is what counts, and loopback is not limited.
    let mut settings = test_api_settings();
    settings.address_limit = Some("2/m".parse::<RateLimit>().expect("valid"));
    let app = spawn_app_with(settings).await;
    let made_up = http_client_with_key(&made_up_key());
    for _ in 0..10 {
        let response = made_up
            .get(app.url("/orders/1"))
            .header("x-forwarded-for", "203.0.113.9")
            .send()
            .await
            .expect("send");
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    }
    app.stop().await;
}

/// Transactions committed in `db` so far, as PostgreSQL's statistics count
/// them (a backend reports its counts when idle, at most once a second).
fn commits(conn: &mut PgConnection, db: &str) -> i64 {
    #[derive(QueryableByName)]
    struct Commits {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    diesel::sql_query("SELECT pg_stat_clear_snapshot()")
        .execute(conn)
        .expect("clear the statistics snapshot");
    diesel::sql_query("SELECT xact_commit AS n FROM pg_stat_database WHERE datname = $1")
        .bind::<diesel::sql_types::Text, _>(db)
        .get_result::<Commits>(conn)
        .expect("pg_stat_database")
        .n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_asks_the_database_nothing_per_call() {
    let app = spawn_app().await;
    let mut stats = diesel::PgConnection::establish(&crate::support::db::admin_url())
        .expect("an admin connection");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = commits(&mut stats, &app.db.name);

    let client = http_client();
    let started = Instant::now();
    let calls = 300;
    for _ in 0..calls {
        let health = client.get(app.url("/healthz")).send().await.expect("send");
        assert_eq!(health.status(), StatusCode::OK);
    }
    let took = started.elapsed();
    // Past the statistics' one-second flush.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let during = commits(&mut stats, &app.db.name) - before;

    // The background check runs once a second: a few, not one per call.
    let seconds = (took + Duration::from_millis(2500)).as_secs() as i64 + 1;
    assert!(
        during <= 3 * seconds,
        "{during} transactions for {calls} calls in {took:?}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_on_the_metrics_address_and_never_on_the_public_port() {
    let app = spawn_app().await;
    let client = http_client();
    let public = client.get(app.url("/metrics")).send().await.expect("send");
    assert_eq!(public.status(), StatusCode::NOT_FOUND);
    let private = client
        .get(app.metrics_url("/metrics"))
        .send()
        .await
        .expect("send");
    assert_eq!(private.status(), StatusCode::OK);
    let text = private.text().await.expect("text");
    assert!(text.contains("http_requests_total"), "{text}");
    app.stop().await;
}

fn key_id(app: &TestApp, key: &str) -> i64 {
    use sha2::{Digest as _, Sha256};
    api_keys::table
        .filter(api_keys::secret_sha256.eq(Sha256::digest(key.as_bytes()).to_vec()))
        .select(api_keys::id)
        .first(&mut app.db.conn())
        .expect("the key's row")
}

async fn place_with(app: &TestApp, client: &reqwest::Client) -> i64 {
    let response = client
        .post(app.url("/orders"))
        .json(&order_json("Ada"))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::CREATED);
    response.json::<Value>().await.expect("JSON")["id"]
        .as_i64()
        .expect("id")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_with_orders_read_own_reads_only_the_orders_placed_with_it() {
    let app = spawn_app().await;
    let shop_a = create_api_key(&app.db.url, "shop-a", &[Scope::Place, Scope::ReadOwn]);
    let shop_b = create_api_key(&app.db.url, "shop-b", &[Scope::Place, Scope::ReadOwn]);
    let (a, b) = (http_client_with_key(&shop_a), http_client_with_key(&shop_b));
    // Neither sends an Idempotency-Key: the key is recorded all the same.
    let of_a = place_with(&app, &a).await;
    let of_b = place_with(&app, &b).await;

    let read = |client: &reqwest::Client, path: String| client.get(app.url(&path)).send();
    let own = read(&a, format!("/orders/{of_a}")).await.expect("send");
    assert_eq!(own.status(), StatusCode::OK);
    // Another key's order is a 404, as one that does not exist.
    let other = read(&a, format!("/orders/{of_b}")).await.expect("send");
    let error = error_of(other, StatusCode::NOT_FOUND).await;
    assert_eq!(error["code"], "order_not_found");
    let receipt = read(&a, format!("/orders/{of_b}/receipt.pdf"))
        .await
        .expect("send");
    assert_eq!(receipt.status(), StatusCode::NOT_FOUND);
    let missing = read(&a, "/orders/999999".to_owned()).await.expect("send");
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    // orders:read reads every order.
    for id in [of_a, of_b] {
        let all = read(&app.client, format!("/orders/{id}"))
            .await
            .expect("send");
        assert_eq!(all.status(), StatusCode::OK);
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_and_transition_records_the_key_that_caused_it() {
    let app = spawn_app().await;
    let shop = create_api_key(&app.db.url, "shop", &[Scope::Place]);
    let payments = create_api_key(&app.db.url, "payments", &[Scope::Pay]);
    let id = place_with(&app, &http_client_with_key(&shop)).await;
    let paid = http_client_with_key(&payments)
        .post(app.url(&format!("/orders/{id}/pay")))
        .json(&json!({"payment_reference": "pi_3Nk"}))
        .send()
        .await
        .expect("send");
    assert_eq!(paid.status(), StatusCode::OK);

    let mut conn = app.db.conn();
    let placed_by: Option<i64> = orders::table
        .find(id)
        .select(orders::api_key_id)
        .first(&mut conn)
        .expect("order");
    assert_eq!(placed_by, Some(key_id(&app, &shop)));
    let events: Vec<(String, Option<i64>)> = order_events::table
        .filter(order_events::order_id.eq(id))
        .order(order_events::seq)
        .select((order_events::event_type, order_events::api_key_id))
        .load(&mut conn)
        .expect("events");
    assert_eq!(
        events,
        vec![
            ("order.placed".to_owned(), Some(key_id(&app, &shop))),
            ("order.paid".to_owned(), Some(key_id(&app, &payments))),
        ]
    );
    app.stop().await;
}
