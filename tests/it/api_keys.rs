//! API keys at the front door: every `/orders` route allowed with its scope
//! and refused without it, revocation, expiry, malformed headers, the
//! idempotency scope, the rate limit, and the `keys` commands.

use std::process::Command;
use std::time::Duration;

use chrono::Utc;
use diesel::prelude::*;
use order_service::api::{self, ApiAuth, RateLimit};
use order_service::api_keys::{self, KeyName, NewSecret, Scope};
use order_service::schema::{api_keys as api_keys_table, order_events, orders, receipts};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::app::{
    Rows, TestApp, create_api_key, error_of, http_client, http_client_with_key, spawn_app,
    spawn_app_on, spawn_app_with, test_api_settings,
};
use crate::support::{TestDb, order_json};

const BIN: &str = env!("CARGO_BIN_EXE_outbox-relay");

/// Asserts a 401 in the contract's shape, with `WWW-Authenticate: Bearer`;
/// its message.
pub(crate) async fn unauthorized(response: reqwest::Response) -> String {
    let challenge = response
        .headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(challenge.starts_with("Bearer"), "{challenge:?}");
    let error = error_of(response, StatusCode::UNAUTHORIZED).await;
    assert_eq!(error["code"], "unauthorized");
    error["message"].as_str().unwrap_or_default().to_owned()
}

/// Asserts a 403 `forbidden` that names `scope`.
pub(crate) async fn forbidden(response: reqwest::Response, scope: Scope) {
    assert!(!response.headers().contains_key("www-authenticate"));
    let error = error_of(response, StatusCode::FORBIDDEN).await;
    assert_eq!(error["code"], "forbidden");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.contains(scope.as_str()), "{message}");
}

/// A client whose key holds every scope but `missing` (and, for
/// `orders:read`, but `orders:read:own`, which grants part of it).
fn all_but(app: &TestApp, missing: Scope) -> reqwest::Client {
    let scopes: Vec<Scope> = Scope::ALL
        .into_iter()
        .filter(|s| *s != missing && *s != Scope::All)
        .filter(|s| !(missing == Scope::Read && *s == Scope::ReadOwn))
        .collect();
    let name = format!(
        "all-but-{}-{:08x}",
        missing.as_str().trim_start_matches("orders:"),
        fastrand::u32(..)
    );
    http_client_with_key(&create_api_key(&app.db.url, &name, &scopes))
}

fn only(app: &TestApp, scope: Scope) -> reqwest::Client {
    let name = format!(
        "only-{}-{:08x}",
        scope.as_str().trim_start_matches("orders:"),
        fastrand::u32(..)
    );
    http_client_with_key(&create_api_key(&app.db.url, &name, &[scope]))
}

pub(crate) async fn post(client: &reqwest::Client, url: String, body: &Value) -> reqwest::Response {
    client
        .post(url)
        .json(body)
        .send()
        .await
        .expect("POST /orders…")
}

async fn get(client: &reqwest::Client, url: String) -> reqwest::Response {
    client.get(url).send().await.expect("GET /orders…")
}

/// The order's status and how many events it has.
fn state_of(app: &TestApp, id: i64) -> (String, i64) {
    let mut conn = app.db.conn();
    let status = orders::table
        .find(id)
        .select(orders::status)
        .first(&mut conn)
        .expect("order");
    let events = order_events::table
        .filter(order_events::order_id.eq(id))
        .count()
        .get_result(&mut conn)
        .expect("count");
    (status, events)
}

fn store_receipt(app: &TestApp, order_id: i64) {
    diesel::insert_into(receipts::table)
        .values((
            receipts::order_id.eq(order_id),
            receipts::pdf.eq(b"%PDF-1.7".to_vec()),
        ))
        .execute(&mut app.db.conn())
        .expect("insert receipt");
}

async fn place(app: &TestApp) -> i64 {
    let response = app.post_order(&order_json("Ada"), None).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let order: Value = response.json().await.expect("JSON");
    order["id"].as_i64().expect("id")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_is_allowed_with_its_scope_and_refused_without_it() {
    let app = spawn_app().await;
    let anonymous = http_client();

    // POST /orders: orders:place.
    let url = app.url("/orders");
    unauthorized(post(&anonymous, url.clone(), &order_json("Ada")).await).await;
    forbidden(
        post(
            &all_but(&app, Scope::Place),
            url.clone(),
            &order_json("Ada"),
        )
        .await,
        Scope::Place,
    )
    .await;
    assert_eq!(app.rows(), Rows::NONE, "nothing written on a refusal");
    let placed = post(&only(&app, Scope::Place), url, &order_json("Ada")).await;
    assert_eq!(placed.status(), StatusCode::CREATED);
    let id = placed.json::<Value>().await.expect("JSON")["id"]
        .as_i64()
        .expect("id");

    // GET /orders/{id}: orders:read.
    let url = app.url(&format!("/orders/{id}"));
    unauthorized(get(&anonymous, url.clone()).await).await;
    forbidden(
        get(&all_but(&app, Scope::Read), url.clone()).await,
        Scope::Read,
    )
    .await;
    let read = only(&app, Scope::Read);
    assert_eq!(get(&read, url).await.status(), StatusCode::OK);

    // GET /orders/{id}/receipt.pdf: orders:read.
    store_receipt(&app, id);
    let url = app.url(&format!("/orders/{id}/receipt.pdf"));
    unauthorized(get(&anonymous, url.clone()).await).await;
    forbidden(
        get(&all_but(&app, Scope::Read), url.clone()).await,
        Scope::Read,
    )
    .await;
    let receipt = get(&read, url).await;
    assert_eq!(receipt.status(), StatusCode::OK);
    assert_eq!(receipt.bytes().await.expect("PDF").as_ref(), b"%PDF-1.7");

    // The transitions, each with its own scope, in an order that lets each
    // one apply; a refusal leaves the order as it was.
    let second = place(&app).await;
    for (order, action, scope, body) in [
        (
            id,
            "pay",
            Scope::Pay,
            json!({"payment_reference": "pi_3Nk"}),
        ),
        (
            id,
            "ship",
            Scope::Ship,
            json!({"carrier": "DHL", "tracking_number": "JD014600006281"}),
        ),
        (id, "deliver", Scope::Deliver, json!({})),
        (
            second,
            "cancel",
            Scope::Cancel,
            json!({"reason": "customer asked"}),
        ),
    ] {
        let url = app.url(&format!("/orders/{order}/{action}"));
        let before = state_of(&app, order);
        unauthorized(post(&anonymous, url.clone(), &body).await).await;
        forbidden(post(&all_but(&app, scope), url.clone(), &body).await, scope).await;
        // A key for another transition is no key for this one.
        forbidden(post(&read, url.clone(), &body).await, scope).await;
        assert_eq!(state_of(&app, order), before, "{action}: nothing written");
        let done = post(&only(&app, scope), url, &body).await;
        assert_eq!(done.status(), StatusCode::OK, "{action}");
        assert_ne!(state_of(&app, order), before, "{action} applied");
    }

    // The action is read as the handler reads it: percent-encoding hides
    // no scope.
    let url = app.url(&format!("/orders/{id}/p%61y"));
    let body = json!({"payment_reference": "pi_x"});
    forbidden(post(&read, url, &body).await, Scope::Pay).await;

    // An unknown action needs a valid key first, then is a 404.
    let url = app.url(&format!("/orders/{id}/return"));
    unauthorized(post(&anonymous, url.clone(), &json!({})).await).await;
    let error = error_of(post(&read, url, &json!({})).await, StatusCode::NOT_FOUND).await;
    assert_eq!(error["code"], "not_found");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_malformed_oversized_and_unknown_keys_are_401_never_500() {
    let app = spawn_app().await;
    let unknown = NewSecret::generate().expect("a key");
    let mut cut_short = app.api_key.clone();
    cut_short.pop();
    let mut typo = app.api_key.clone().into_bytes();
    typo[12] = if typo[12] == b'x' { b'y' } else { b'x' };
    let typo = String::from_utf8(typo).expect("ASCII");
    let headers: Vec<(&str, Vec<u8>)> = vec![
        ("empty", b"".to_vec()),
        ("scheme only", b"Bearer".to_vec()),
        ("basic", b"Basic dXNlcjpwYXNz".to_vec()),
        ("bare key", app.api_key.clone().into_bytes()),
        ("cut short", format!("Bearer {cut_short}").into_bytes()),
        ("typo", format!("Bearer {typo}").into_bytes()),
        (
            "another vendor's",
            b"Bearer ghp_0123456789abcdefghij".to_vec(),
        ),
        ("not ASCII", b"Bearer ork_\xc3\xa9t\xc3\xa9".to_vec()),
        (
            "oversized",
            format!("Bearer {}", "a".repeat(16 * 1024)).into_bytes(),
        ),
        (
            "unknown",
            format!("Bearer {}", unknown.expose()).into_bytes(),
        ),
    ];
    let anonymous = http_client();
    for (what, value) in headers {
        let value = reqwest::header::HeaderValue::from_bytes(&value).expect("header value");
        let response = anonymous
            .post(app.url("/orders"))
            .header("authorization", value)
            .json(&order_json("Ada"))
            .send()
            .await
            .expect("POST");
        let message = unauthorized(response).await;
        assert!(
            !message.contains(&app.api_key[4..]),
            "{what}: the key is not echoed"
        );
    }
    // Two Authorization headers, one of them valid: refused, not guessed at.
    let response = anonymous
        .get(app.url("/orders/1"))
        .header("authorization", format!("Bearer {}", app.api_key))
        .header("authorization", "Bearer nonsense")
        .send()
        .await
        .expect("GET");
    unauthorized(response).await;
    assert_eq!(app.rows(), Rows::NONE);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_key_is_refused_from_its_next_request() {
    let app = spawn_app().await;
    let key = create_api_key(&app.db.url, "shop", &[Scope::Place, Scope::Read]);
    let shop = http_client_with_key(&key);
    let placed = post(&shop, app.url("/orders"), &order_json("Ada")).await;
    assert_eq!(placed.status(), StatusCode::CREATED);

    let out = Command::new(BIN)
        .args(["keys", "revoke", "shop"])
        .env("DATABASE_URL", &app.db.url)
        .output()
        .expect("keys revoke");
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("revoked"));

    let before = app.rows();
    let message = unauthorized(post(&shop, app.url("/orders"), &order_json("Ada")).await).await;
    assert!(message.contains("revoked"), "{message}");
    unauthorized(get(&shop, app.url("/orders/1")).await).await;
    assert_eq!(app.rows(), before, "nothing written");
    // Other keys are untouched.
    assert_eq!(app.get("/orders/1").await.status(), StatusCode::OK);

    // Revoking again changes nothing and says so; an unknown name is exit 2.
    let again = Command::new(BIN)
        .args(["keys", "revoke", "shop"])
        .env("DATABASE_URL", &app.db.url)
        .output()
        .expect("keys revoke");
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains("already revoked"));
    let unknown = Command::new(BIN)
        .args(["keys", "revoke", "nobody"])
        .env("DATABASE_URL", &app.db.url)
        .output()
        .expect("keys revoke");
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("\"nobody\""));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_key_is_refused_and_one_not_yet_expired_works() {
    let app = spawn_app().await;
    let mut conn = app.db.conn();
    let mut key_expiring = |name: &str, from_now: chrono::Duration| {
        let name = KeyName::parse(name).expect("name");
        let at = Utc::now() + from_now;
        api_keys::create_key(&mut conn, &name, &[Scope::Read], Some(at))
            .expect("create")
            .secret
            .expose()
            .to_owned()
    };
    let expired = key_expiring("expired", chrono::Duration::seconds(-1));
    let fresh = key_expiring("fresh", chrono::Duration::days(90));
    let id = place(&app).await;
    let url = app.url(&format!("/orders/{id}"));

    let message = unauthorized(get(&http_client_with_key(&expired), url.clone()).await).await;
    assert!(message.contains("expired"), "{message}");
    let ok = get(&http_client_with_key(&fresh), url).await;
    assert_eq!(ok.status(), StatusCode::OK);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_keys_belong_to_the_api_key_that_sent_them() {
    let app = spawn_app().await;
    let alice = http_client_with_key(&create_api_key(&app.db.url, "alice", &[Scope::All]));
    let mallory = http_client_with_key(&create_api_key(&app.db.url, "mallory", &[Scope::All]));
    let keyed = |client: &reqwest::Client, body: &Value| {
        client
            .post(app.url("/orders"))
            .header("idempotency-key", "order-1")
            .json(body)
            .send()
    };

    // Mallory takes "order-1" first, with an order of her own.
    let taken = keyed(&mallory, &order_json("Mallory")).await.expect("POST");
    assert_eq!(taken.status(), StatusCode::CREATED);
    let taken: Value = taken.json().await.expect("JSON");
    // Alice's order with the same key is still hers, and new.
    let placed = keyed(&alice, &order_json("Alice")).await.expect("POST");
    assert_eq!(placed.status(), StatusCode::CREATED);
    let placed: Value = placed.json().await.expect("JSON");
    assert_ne!(placed["id"], taken["id"]);
    assert_eq!(placed["customer_name"], "Alice");
    // Each one's retry finds its own order.
    let retried = keyed(&alice, &order_json("Alice")).await.expect("POST");
    assert_eq!(retried.status(), StatusCode::OK);
    assert_eq!(
        retried.json::<Value>().await.expect("JSON")["id"],
        placed["id"]
    );
    let conflict = keyed(&alice, &order_json("Someone else"))
        .await
        .expect("POST");
    error_of(conflict, StatusCode::CONFLICT).await;

    // Transitions too: the same key pays each one's order.
    for (client, order) in [(&mallory, &taken), (&alice, &placed)] {
        let paid = client
            .post(app.url(&format!("/orders/{}/pay", order["id"])))
            .header("idempotency-key", "pay-1")
            .json(&json!({"payment_reference": "pi_1"}))
            .send()
            .await
            .expect("POST pay");
        assert_eq!(paid.status(), StatusCode::OK);
        assert_eq!(paid.json::<Value>().await.expect("JSON")["status"], "paid");
    }
    assert_eq!(app.rows().orders, 2);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_over_its_rate_limit_is_429_with_retry_after_and_others_are_served() {
    let app = spawn_app_with(api::ApiSettings {
        rate_limit: Some("3/m".parse::<RateLimit>().expect("a limit")),
        ..test_api_settings()
    })
    .await;
    let id = place(&app).await;
    for _ in 0..2 {
        assert_eq!(
            app.get(&format!("/orders/{id}")).await.status(),
            StatusCode::OK
        );
    }
    let before = app.rows();
    let limited = app.post_order(&order_json("Ada"), None).await;
    let retry_after: u64 = limited
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("a Retry-After in seconds");
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    let error = error_of(limited, StatusCode::TOO_MANY_REQUESTS).await;
    assert_eq!(error["code"], "rate_limited");
    assert_eq!(app.rows(), before, "nothing written");

    let other = http_client_with_key(&create_api_key(&app.db.url, "other", &[Scope::Read]));
    let served = get(&other, app.url(&format!("/orders/{id}"))).await;
    assert_eq!(
        served.status(),
        StatusCode::OK,
        "each key has its own budget"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_used_at_is_written_at_most_about_once_a_minute() {
    let app = spawn_app().await;
    let last_used = || -> Option<chrono::DateTime<Utc>> {
        api_keys_table::table
            .filter(api_keys_table::name.eq("test"))
            .select(api_keys_table::last_used_at)
            .first(&mut app.db.conn())
            .expect("the test key")
    };
    assert_eq!(last_used(), None);
    app.get("/orders/1").await;
    let first = last_used().expect("set on first use");
    app.get("/orders/1").await;
    assert_eq!(last_used(), Some(first), "not rewritten within the minute");

    diesel::update(api_keys_table::table.filter(api_keys_table::name.eq("test")))
        .set(api_keys_table::last_used_at.eq(Utc::now() - chrono::Duration::minutes(2)))
        .execute(&mut app.db.conn())
        .expect("age it");
    app.get("/orders/1").await;
    assert!(
        last_used().is_some_and(|at| at > first),
        "moved on after a minute"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_answers_are_not_stored_by_caches_and_carry_no_last_error() {
    let app = spawn_app().await;
    let placed = app.post_order(&order_json("Ada"), None).await;
    assert_eq!(placed.headers()["cache-control"], "no-store");
    let order: Value = placed.json().await.expect("JSON");
    let fetched = app.get(&format!("/orders/{}", order["id"])).await;
    assert_eq!(fetched.headers()["cache-control"], "no-store");
    let fetched: Value = fetched.json().await.expect("JSON");
    for job in fetched["jobs"].as_array().expect("jobs") {
        assert!(job.get("last_error").is_none(), "{job}");
    }
    let refused = http_client().get(app.url("/orders/1")).send().await;
    assert_eq!(refused.expect("GET").headers()["cache-control"], "no-store");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_link_reaches_its_check_without_a_key() {
    let app = spawn_app().await;
    let id = place(&app).await;
    store_receipt(&app, id);
    let anonymous = http_client();
    for query in [
        "expires=4102444800&signature=abc",
        "signature=",
        "expires=1",
    ] {
        let url = app.url(&format!("/orders/{id}/receipt.pdf?{query}"));
        // Refused by the link's own check (a genuine link opens the receipt:
        // receipt_links.rs), not by the key check.
        let error = error_of(get(&anonymous, url).await, StatusCode::FORBIDDEN).await;
        assert_eq!(error["code"], "invalid_link", "{query}");
    }
    // Other query parameters are no link: the key is asked for.
    let url = app.url(&format!("/orders/{id}/receipt.pdf?download=1"));
    unauthorized(get(&anonymous, url).await).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_api_auth_none_no_key_is_asked_for() {
    let app = spawn_app_with(api::ApiSettings {
        auth: ApiAuth::None,
        ..test_api_settings()
    })
    .await;
    let placed = post(&http_client(), app.url("/orders"), &order_json("Ada")).await;
    assert_eq!(placed.status(), StatusCode::CREATED);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_database_down_a_keyed_request_is_a_503_not_a_401_or_500() {
    let settings = api::ApiSettings {
        db_wait: Duration::from_millis(500),
        ..test_api_settings()
    };
    let database = api::connect("postgres://postgres@127.0.0.1:1/nowhere", &settings);
    let app = spawn_app_on(TestDb::new(), database, settings).await;
    let response = app.post_order(&order_json("Ada"), None).await;
    assert!(response.headers().contains_key("retry-after"));
    let error = error_of(response, StatusCode::SERVICE_UNAVAILABLE).await;
    assert_eq!(error["code"], "database_unavailable");
    // A header that holds no key needs no database to refuse.
    unauthorized(get(&http_client(), app.url("/orders/1")).await).await;
    app.stop().await;
}

fn keys(db: &TestDb, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .arg("keys")
        .args(args)
        .env("DATABASE_URL", &db.url)
        .output()
        .expect("run outbox-relay keys")
}

fn key_count(db: &TestDb) -> i64 {
    api_keys_table::table
        .count()
        .get_result(&mut db.conn())
        .expect("count")
}

#[test]
fn keys_create_prints_a_key_once_and_keeps_only_its_hash() {
    let db = TestDb::new();
    let out = keys(
        &db,
        &[
            "create",
            "--name",
            "shop",
            "--scopes",
            "orders:place,orders:read",
            "--expires-in",
            "90d",
            "--json",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let created: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let key = created["key"].as_str().expect("key");
    assert!(key.starts_with("ork_") && key.len() == 53, "{key}");
    assert_eq!(created["name"], "shop");
    assert_eq!(created["scopes"], json!(["orders:place", "orders:read"]));
    assert!(created["id"].is_i64());

    // Stored: the hash, never the key.
    let dump: Vec<String> = diesel::sql_query("SELECT row_to_json(k)::text AS row FROM api_keys k")
        .load::<Row>(&mut db.conn())
        .expect("dump")
        .into_iter()
        .map(|r| r.row)
        .collect();
    assert_eq!(dump.len(), 1);
    assert!(!dump[0].contains(&key[4..]), "{dump:?}");

    let listed = keys(&db, &["list"]);
    let table = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.status.success());
    for expected in [
        "NAME",
        "LAST USED",
        "shop",
        "orders:place,orders:read",
        "never",
    ] {
        assert!(table.contains(expected), "{expected}: {table}");
    }
    assert!(!table.contains(&key[4..]));
    let json_list = keys(&db, &["list", "--json"]);
    let list: Value = serde_json::from_slice(&json_list.stdout).expect("JSON");
    assert_eq!(list[0]["name"], "shop");
    assert!(list[0]["expires_at"].is_string());
}

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = diesel::sql_types::Text)]
    row: String,
}

#[test]
fn keys_create_refuses_bad_input_naming_it_and_writes_nothing() {
    let db = TestDb::new();
    let cases: [(&[&str], &[&str]); 5] = [
        (
            &[
                "--name",
                "shop",
                "--scopes",
                "orders:place,orders:fly,admin",
            ],
            &["\"orders:fly\"", "\"admin\"", "--scopes"],
        ),
        (&["--name", "shop", "--scopes", ""], &["--scopes"]),
        (
            &[
                "--name",
                "shop",
                "--scopes",
                "orders:read",
                "--expires-in",
                "soon",
            ],
            &["soon", "--expires-in"],
        ),
        (
            &[
                "--name",
                "shop",
                "--scopes",
                "orders:read",
                "--expires-in",
                "0s",
            ],
            &["0s", "--expires-in"],
        ),
        (
            &["--name", "a b", "--scopes", "orders:read"],
            &["a b", "--name"],
        ),
    ];
    for (args, named) in cases {
        let mut argv = vec!["create"];
        argv.extend_from_slice(args);
        let out = keys(&db, &argv);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        for name in named {
            assert!(stderr.contains(name), "{args:?} names {name}: {stderr}");
        }
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    assert_eq!(key_count(&db), 0);

    let first = keys(
        &db,
        &["create", "--name", "shop", "--scopes", "orders:read"],
    );
    assert!(first.status.success());
    let duplicate = keys(&db, &["create", "--name", "shop", "--scopes", "orders:*"]);
    let stderr = String::from_utf8_lossy(&duplicate.stderr);
    assert_eq!(duplicate.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("\"shop\"") && stderr.contains("already exists"),
        "{stderr}"
    );
    assert_eq!(key_count(&db), 1);
}

#[test]
fn serve_refuses_bad_api_auth_and_rate_limit_values_naming_them() {
    for (variable, value) in [("API_AUTH", "maybe"), ("API_RATE_LIMIT", "50/fortnight")] {
        let out = Command::new(BIN)
            .arg("serve")
            .env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/nowhere")
            .env("API_ADDR", "127.0.0.1:0")
            .env(variable, value)
            .output()
            .expect("run outbox-relay serve");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(variable) && stderr.contains(value),
            "{stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_api_auth_none_warns_loudly_at_start() {
    use crate::support::process::{BinProcess, Launch};
    let db = TestDb::new();
    let (mut api, base) =
        BinProcess::start_api(Launch::serve("open-api", &db.url).env("API_AUTH", "none")).await;
    let placed = post(&http_client(), format!("{base}/orders"), &order_json("Ada")).await;
    assert_eq!(placed.status(), StatusCode::CREATED);
    let output = api.output();
    assert!(
        output.contains("WARN") && output.contains("API_AUTH=none"),
        "{output}"
    );
    api.terminate().await;
}
