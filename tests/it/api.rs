//! The order API over real HTTP: every status of the contract, the error
//! shape, idempotency, and that no rejected request writes anything.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection as _;
use diesel::prelude::*;
use order_service::api::{self, MAX_BODY_BYTES};
use order_service::effects::receipt::store_receipt;
use order_service::orders::OrderId;
use order_service::schema::{jobs_all, receipts};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::app::{
    Rows, cli_api_key, error_of, http_client_with_key, spawn_app, spawn_app_on, spawn_app_with,
    test_api_settings,
};
use crate::support::{TestDb, executor, order_json, spawn_relay, test_settings};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valid_order_is_created_with_its_items_and_jobs() {
    let app = spawn_app().await;

    let response = app.post_order(&order_json("Ada Lovelace"), None).await;

    assert_eq!(response.status(), StatusCode::CREATED);
    let location = response.headers()["location"]
        .to_str()
        .expect("ASCII")
        .to_owned();
    let created: Value = response.json().await.expect("JSON");
    let id = created["id"].as_i64().expect("id");
    assert_eq!(location, format!("/orders/{id}"));
    assert_eq!(created["customer_name"], "Ada Lovelace");
    assert_eq!(created["currency"], "EUR");
    assert_eq!(created["total_cents"], 2 * 450 + 1200);
    assert_eq!(created["items"].as_array().map(Vec::len), Some(2));
    assert_eq!(created["items"][0]["quantity"], 2);
    let kinds: Vec<&str> = created["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| j["kind"].as_str().expect("kind"))
        .collect();
    assert_eq!(
        kinds,
        ["confirmation_email", "receipt_pdf", "order_webhook"]
    );
    for job in created["jobs"].as_array().expect("jobs") {
        assert_eq!(job["status"], "pending");
        assert_eq!(job["attempts"], 0);
        assert_eq!(job["max_attempts"], 8);
        // last_error quotes receivers and SMTP servers; operators
        // read it in /admin and `jobs list`, API clients never do.
        assert!(job.get("last_error").is_none(), "{job}");
    }

    let fetched = app.get(&location).await;
    assert_eq!(fetched.status(), StatusCode::OK);
    let fetched: Value = fetched.json().await.expect("JSON");
    assert_eq!(fetched, created);
    assert_eq!(
        app.rows(),
        Rows {
            orders: 1,
            items: 2,
            jobs: 3
        }
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_get_max_attempts_from_the_settings() {
    let app = spawn_app_with(api::ApiSettings {
        max_attempts: 3,
        ..test_api_settings()
    })
    .await;

    let created: Value = app
        .post_order(&order_json("Ada"), None)
        .await
        .json()
        .await
        .expect("JSON");

    assert!(
        created["jobs"]
            .as_array()
            .expect("jobs")
            .iter()
            .all(|j| j["max_attempts"] == 3),
        "{created}"
    );
    let stored: Vec<i32> = jobs_all::table
        .select(jobs_all::max_attempts)
        .load(&mut app.db.conn())
        .expect("jobs");
    assert_eq!(stored, [3, 3, 3]);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bidi_and_invisible_format_controls_in_names_and_addresses_are_a_422_naming_the_field() {
    let app = spawn_app().await;
    let cases: Vec<(&str, &str, &str)> = vec![
        ("/customer_name", "Ada \u{202E}ecalevoL", "customer_name"),
        (
            "/customer_name",
            "Ada\u{2066} Lovelace\u{2069}",
            "customer_name",
        ),
        ("/customer_name", "Ad\u{200B}a", "customer_name"),
        ("/items/0/name", "\u{202E}gnp.exe", "items[0].name"),
        ("/items/0/sku", "TEA\u{2067}-1", "items[0].sku"),
        ("/items/0/name", "Tea\u{FEFF}", "items[0].name"),
        (
            "/customer_email",
            "ada\u{202E}@example.com",
            "customer_email",
        ),
    ];
    let rows = app.rows();
    for (pointer, value, field) in cases {
        let mut body = order_json("Ada");
        *body.pointer_mut(pointer).expect(pointer) = json!(value);
        let error = error_of(
            app.post_order(&body, None).await,
            StatusCode::UNPROCESSABLE_ENTITY,
        )
        .await;
        assert_eq!(error["field"], field, "{pointer} = {value:?}");
        assert!(
            error["message"]
                .as_str()
                .is_some_and(|m| m.contains("invisible format")),
            "{error}"
        );
    }
    assert_eq!(app.rows(), rows, "nothing written");
    // Emoji sequences (joiners, variation selectors) and right-to-left text
    // without controls still pass.
    let mut body = order_json("שלום 👩‍💻 🎉\u{FE0F}");
    body["items"][0]["name"] = json!("Tee \u{200C}x");
    assert_eq!(
        app.post_order(&body, None).await.status(),
        StatusCode::CREATED
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_invalid_field_is_a_422_naming_its_path_and_writes_nothing() {
    let app = spawn_app().await;
    let cases: Vec<(&str, Value, &str)> = vec![
        ("/customer_email", json!("not-an-email"), "customer_email"),
        ("/customer_name", json!(""), "customer_name"),
        ("/currency", json!("eur"), "currency"),
        ("/items", json!([]), "items"),
        ("/items/0/quantity", json!(0), "items[0].quantity"),
        ("/items/0/quantity", json!("2"), "items[0].quantity"),
        (
            "/items/1/unit_price_cents",
            json!(-1),
            "items[1].unit_price_cents",
        ),
        ("/items/1/sku", json!(null), "items[1].sku"),
    ];
    for (pointer, value, field) in cases {
        let mut body = order_json("Ada");
        *body.pointer_mut(pointer).expect(pointer) = value.clone();

        let error = error_of(
            app.post_order(&body, None).await,
            StatusCode::UNPROCESSABLE_ENTITY,
        )
        .await;

        assert_eq!(error["code"], "validation_failed", "{pointer} = {value}");
        assert_eq!(error["field"], field, "{pointer} = {value}");
        assert!(
            error["message"].as_str().is_some_and(|m| m.contains(field)),
            "{error}"
        );
    }

    let mut typo = order_json("Ada");
    typo["items"][0]["quantiy"] = json!(3);
    let error = error_of(
        app.post_order(&typo, None).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    assert_eq!(error["field"], "items[0].quantiy");

    let mut too_many = order_json("Ada");
    let item = too_many["items"][0].clone();
    too_many["items"] = Value::Array(vec![item; order_service::orders::MAX_ITEMS + 1]);
    let error = error_of(
        app.post_order(&too_many, None).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    assert_eq!(error["field"], "items");

    let error = error_of(
        app.post_order(&json!([1, 2, 3]), None).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    assert_eq!(error["field"], "", "the body itself: {error}");

    assert_eq!(app.rows(), Rows::NONE);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_is_a_400_and_writes_nothing() {
    let app = spawn_app().await;
    let bodies: Vec<Vec<u8>> = vec![
        b"{\"customer_email\":".to_vec(),
        b"".to_vec(),
        b"not json".to_vec(),
        b"{} {}".to_vec(),
        vec![b'"', 0xff, 0xfe, b'"'],
    ];
    for body in bodies {
        let shown = String::from_utf8_lossy(&body).into_owned();
        let error = error_of(
            app.post_raw(Some("application/json"), body, Some("k"))
                .await,
            StatusCode::BAD_REQUEST,
        )
        .await;
        assert_eq!(error["code"], "malformed_json", "{shown:?}");
        assert!(error.get("field").is_none(), "{error}");
    }
    assert_eq!(app.rows(), Rows::NONE);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_not_declared_as_json_is_a_415_and_writes_nothing() {
    let app = spawn_app().await;
    let valid = serde_json::to_vec(&order_json("Ada")).expect("JSON");
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("application/json; charset=latin1"),
    ] {
        let error = error_of(
            app.post_raw(content_type, valid.clone(), None).await,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        )
        .await;
        assert_eq!(error["code"], "unsupported_media_type", "{content_type:?}");
    }
    assert_eq!(app.rows(), Rows::NONE);

    let accepted = app
        .post_raw(Some("application/json; charset=utf-8"), valid, None)
        .await;
    assert_eq!(accepted.status(), StatusCode::CREATED);
    app.stop().await;
}

/// A valid order padded with trailing spaces (still valid JSON) to `len` bytes.
fn padded_order(len: usize) -> Vec<u8> {
    let mut body = serde_json::to_vec(&order_json("Ada")).expect("JSON");
    assert!(body.len() <= len);
    body.resize(len, b' ');
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_64_kib_is_a_413_and_one_of_exactly_64_kib_is_accepted() {
    let app = spawn_app().await;
    assert_eq!(MAX_BODY_BYTES, 65_536);

    let error = error_of(
        app.post_raw(
            Some("application/json"),
            padded_order(MAX_BODY_BYTES + 1),
            None,
        )
        .await,
        StatusCode::PAYLOAD_TOO_LARGE,
    )
    .await;
    assert_eq!(error["code"], "payload_too_large");
    assert_eq!(app.rows(), Rows::NONE);

    let at_limit = app
        .post_raw(Some("application/json"), padded_order(MAX_BODY_BYTES), None)
        .await;
    assert_eq!(at_limit.status(), StatusCode::CREATED);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_idempotency_key_is_a_400_and_writes_nothing() {
    let app = spawn_app().await;
    let long = "k".repeat(256);
    for key in ["has space", long.as_str()] {
        let error = error_of(
            app.post_order(&order_json("Ada"), Some(key)).await,
            StatusCode::BAD_REQUEST,
        )
        .await;
        assert_eq!(error["code"], "invalid_idempotency_key", "{key}");
    }
    assert_eq!(app.rows(), Rows::NONE);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_orders_routes_and_methods_are_json_errors() {
    let app = spawn_app().await;
    for path in [
        "/orders/999999",
        "/orders/abc",
        "/orders/0",
        "/orders/-1",
        "/orders/99999999999999999999",
        "/orders/999999/receipt.pdf",
    ] {
        let error = error_of(app.get(path).await, StatusCode::NOT_FOUND).await;
        assert_eq!(error["code"], "order_not_found", "{path}");
    }

    let error = error_of(app.get("/nowhere").await, StatusCode::NOT_FOUND).await;
    assert_eq!(error["code"], "not_found");

    let response = app
        .client
        .delete(app.url("/orders"))
        .send()
        .await
        .expect("DELETE");
    let error = error_of(response, StatusCode::METHOD_NOT_ALLOWED).await;
    assert_eq!(error["code"], "method_not_allowed");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_and_order_return_the_same_order_with_200() {
    let app = spawn_app().await;
    let first = app.post_order(&order_json("Ada"), Some("order-1")).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.expect("JSON");

    let again = app.post_order(&order_json("Ada"), Some("order-1")).await;
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(
        again.headers()["location"],
        format!("/orders/{}", first["id"]).as_str()
    );
    let again: Value = again.json().await.expect("JSON");
    assert_eq!(again, first);

    // The same order written differently (key order, spacing) is the same request.
    let reordered = br#"{ "items": [
        {"unit_price_cents": 450, "quantity": 2, "name": "Green tea", "sku": "TEA-1"},
        {"sku": "MUG-2", "name": "Mug", "quantity": 1, "unit_price_cents": 1200}
      ], "currency": "EUR", "customer_name": "Ada", "customer_email": "ada@example.com" }"#;
    let respelled = app
        .post_raw(
            Some("application/json"),
            reordered.to_vec(),
            Some("order-1"),
        )
        .await;
    assert_eq!(respelled.status(), StatusCode::OK);

    assert_eq!(
        app.rows(),
        Rows {
            orders: 1,
            items: 2,
            jobs: 3
        }
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_with_another_order_is_a_409_and_writes_nothing() {
    let app = spawn_app().await;
    let first = app.post_order(&order_json("Ada"), Some("order-1")).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let before = app.rows();

    let error = error_of(
        app.post_order(&order_json("Grace"), Some("order-1")).await,
        StatusCode::CONFLICT,
    )
    .await;

    assert_eq!(error["code"], "idempotency_conflict");
    assert_eq!(app.rows(), before);
    app.stop().await;
}

/// Connections to this test's database besides `conn`.
fn other_backends(conn: &mut PgConnection) -> i64 {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    diesel::sql_query(
        "SELECT count(*) AS n FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .get_result::<Count>(conn)
    .expect("count the connections")
    .n
}

/// The key check and the placement of each order run on the API's own
/// connections, which calls take in turn: four keyed orders open five of
/// them, beside the pool's (the first order's key check, then a placement
/// each: the later orders' key is let in from the cache and checked by the
/// placement's own statement, `key_cache.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_are_placed_on_the_apis_own_connections() {
    let app = spawn_app().await;
    for n in 0..4 {
        let placed = app
            .post_order(&order_json("Ada"), Some(&format!("own-{n}")))
            .await;
        assert_eq!(placed.status(), StatusCode::CREATED);
    }
    let others = other_backends(&mut app.db.conn());
    assert!(
        others >= 5,
        "{others} other connections: the API's own did not open"
    );
    app.stop().await;
}

/// `fallback_application_name` is an option libpq knows and tokio-postgres
/// does not: the API's own connections cannot open, so the key check and
/// the placement run on the pool, with the same answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_are_placed_on_the_pool_when_the_apis_own_connections_cannot_open() {
    let db = TestDb::new();
    let separator = if db.url.contains('?') { '&' } else { '?' };
    let url = format!("{}{separator}fallback_application_name=shop", db.url);
    let settings = test_api_settings();
    let database = api::connect(&url, &settings);
    let app = spawn_app_on(db, database, settings).await;

    let first = app.post_order(&order_json("Ada"), Some("order-1")).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.expect("JSON");
    let again = app.post_order(&order_json("Ada"), Some("order-1")).await;
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(again.json::<Value>().await.expect("JSON"), first);
    let conflict = app.post_order(&order_json("Grace"), Some("order-1")).await;
    assert_eq!(
        error_of(conflict, StatusCode::CONFLICT).await["code"],
        "idempotency_conflict"
    );
    let other = app.post_order(&order_json("Grace"), None).await;
    assert_eq!(other.status(), StatusCode::CREATED);

    let mut conn = app.db.conn();
    // Eight statements (four key checks, four placements) on the pool's
    // connections, which serve one request after another: not the eight
    // connections of the API's own that they would each have taken.
    let others = other_backends(&mut conn);
    assert!(
        others < 8,
        "{others} other connections: the API's own opened"
    );
    let used: Option<chrono::DateTime<chrono::Utc>> = order_service::schema::api_keys::table
        .select(order_service::schema::api_keys::last_used_at)
        .first(&mut conn)
        .expect("the test's key");
    assert!(
        used.is_some(),
        "the key check on the pool notes the key's use"
    );
    assert_eq!(
        app.rows(),
        Rows {
            orders: 2,
            items: 4,
            jobs: 6
        }
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_concurrent_requests_with_one_key_place_exactly_one_order() {
    let app = spawn_app().await;
    let body = order_json("Ada");

    let responses = futures_util::future::join_all(
        (0..10).map(|_| app.post_order(&body, Some("one-key-for-all"))),
    )
    .await;

    let mut statuses = Vec::new();
    let mut ids = Vec::new();
    for response in responses {
        statuses.push(response.status());
        let order: Value = response.json().await.expect("JSON");
        ids.push(order["id"].as_i64().expect("id"));
    }
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::CREATED)
            .count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == StatusCode::OK).count(),
        9,
        "{statuses:?}"
    );
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 1, "one order id: {ids:?}");
    assert_eq!(
        app.rows(),
        Rows {
            orders: 1,
            items: 2,
            jobs: 3
        }
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receipt_is_404_until_its_job_has_run_then_a_pdf() {
    let app = spawn_app().await;
    let order: Value = app
        .post_order(&order_json("Ada"), None)
        .await
        .json()
        .await
        .expect("JSON");
    let id = order["id"].as_i64().expect("id");
    let path = format!("/orders/{id}/receipt.pdf");

    let error = error_of(app.get(&path).await, StatusCode::NOT_FOUND).await;
    assert_eq!(error["code"], "receipt_not_ready");

    const PDF: &[u8] = b"%PDF-1.4\n% a receipt\n%%EOF\n";
    let relay = spawn_relay(
        &app.db,
        test_settings("receipts", &["receipt_pdf"]),
        executor(|job| async move {
            Ok(Some(store_receipt(
                OrderId::new(job.payload["order_id"].as_i64().unwrap_or_default()),
                PDF.to_vec(),
            )))
        }),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let response = loop {
        let response = app.get(&path).await;
        if response.status() == StatusCode::OK {
            break response;
        }
        assert!(Instant::now() < deadline, "no receipt after 20s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    relay.stop().await;

    assert_eq!(response.headers()["content-type"], "application/pdf");
    assert_eq!(response.bytes().await.expect("body").as_ref(), PDF);
    let order: Value = app
        .get(&format!("/orders/{id}"))
        .await
        .json()
        .await
        .expect("JSON");
    let receipt_job = order["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .find(|j| j["kind"] == "receipt_pdf")
        .expect("receipt job")
        .clone();
    assert_eq!(receipt_job["status"], "done", "{receipt_job}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_row_is_served_as_a_pdf() {
    let app = spawn_app().await;
    let order: Value = app
        .post_order(&order_json("Ada"), None)
        .await
        .json()
        .await
        .expect("JSON");
    let id = order["id"].as_i64().expect("id");
    diesel::insert_into(receipts::table)
        .values((
            receipts::order_id.eq(id),
            receipts::pdf.eq(b"%PDF-1.7".to_vec()),
        ))
        .execute(&mut app.db.conn())
        .expect("insert receipt");

    let response = app.get(&format!("/orders/{id}/receipt.pdf")).await;

    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/pdf");
    assert_eq!(response.bytes().await.expect("body").as_ref(), b"%PDF-1.7");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_is_down_is_a_503_with_json_never_a_hang() {
    // Without keys, so that validation needs no database (with keys, the key
    // is checked first, and that needs it: api_keys.rs tests that case).
    let settings = api::ApiSettings {
        db_wait: Duration::from_millis(500),
        auth: api::ApiAuth::None,
        ..test_api_settings()
    };
    // Nothing listens on port 1: every connection attempt is refused.
    let database = api::connect("postgres://postgres@127.0.0.1:1/nowhere", &settings);
    let app = spawn_app_on(TestDb::new(), database, settings).await;

    let started = Instant::now();
    let response = app.post_order(&order_json("Ada"), Some("k")).await;
    assert!(response.headers().contains_key("retry-after"));
    let error = error_of(response, StatusCode::SERVICE_UNAVAILABLE).await;
    assert_eq!(error["code"], "database_unavailable");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    let error = error_of(app.get("/orders/1").await, StatusCode::SERVICE_UNAVAILABLE).await;
    assert_eq!(error["code"], "database_unavailable");

    let health = app.get("/healthz").await;
    assert_eq!(health.status(), StatusCode::SERVICE_UNAVAILABLE);
    let health: Value = health.json().await.expect("JSON");
    assert_eq!(health["status"], "unavailable");
    assert_eq!(health["error"]["code"], "database_unavailable");

    // Validation needs no database: a bad order is still a 422.
    let mut bad = order_json("Ada");
    bad["currency"] = json!("???");
    let error = error_of(
        app.post_order(&bad, None).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    assert_eq!(error["field"], "currency");
    assert_eq!(app.rows(), Rows::NONE);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_is_200_when_the_database_answers() {
    let app = spawn_app().await;
    let health = app.get("/healthz").await;
    assert_eq!(health.status(), StatusCode::OK);
    let health: Value = health.json().await.expect("JSON");
    assert_eq!(health, json!({"status": "ok", "database": "up"}));
    app.stop().await;
}

/// Holds a lock on `orders` in another session until dropped (or released).
struct TableLock(PgConnection);

impl TableLock {
    fn take(db: &TestDb, mode: &str) -> TableLock {
        let mut conn = db.conn();
        conn.batch_execute(&format!("BEGIN; LOCK TABLE orders IN {mode} MODE"))
            .expect("lock orders");
        TableLock(conn)
    }
    fn release(mut self) {
        self.0.batch_execute("ROLLBACK").expect("release the lock");
    }

    /// Waits until another session is queued behind this lock, i.e. until a
    /// request has reached the database and holds its connection.
    async fn wait_for_a_waiter(&mut self) {
        #[derive(QueryableByName)]
        struct Waiting {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let conn = &mut self.0;
        crate::support::wait_until(
            "a request blocked on the lock",
            Duration::from_secs(10),
            || {
                diesel::sql_query(
                    // Every test database is a copy of one template, so
                    // `orders` has the same OID in all of them: without the
                    // database filter, another test's waiter counts here.
                    "SELECT count(*) AS n FROM pg_locks \
                 WHERE database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                   AND relation = 'orders'::regclass AND NOT granted",
                )
                .get_result::<Waiting>(conn)
                .expect("pg_locks")
                .n > 0
            },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_stuck_behind_a_lock_is_cancelled_answered_503_and_leaves_nothing() {
    // The lock holds the first placement however long the limit is; the
    // limit also bounds the retry's statements, on connections it may have to
    // open and prepare first. At 300 ms a CI run on a loaded machine (browser
    // tests and bench drains beside it) once answered the retry 503 as well.
    let app = spawn_app_with(api::ApiSettings {
        statement_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(10),
        ..test_api_settings()
    })
    .await;
    let lock = TableLock::take(&app.db, "EXCLUSIVE");

    let error = error_of(
        app.post_order(&order_json("Ada"), Some("k")).await,
        StatusCode::SERVICE_UNAVAILABLE,
    )
    .await;
    assert_eq!(error["code"], "database_unavailable");

    lock.release();
    assert_eq!(
        app.rows(),
        Rows::NONE,
        "the cancelled insert was rolled back"
    );
    let retried = app.post_order(&order_json("Ada"), Some("k")).await;
    let status = retried.status();
    let body = retried.text().await.unwrap_or_default();
    assert_eq!(status, StatusCode::CREATED, "the retry was answered {body}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_the_time_limit_is_a_503_timeout() {
    let app = spawn_app_with(api::ApiSettings {
        request_timeout: Duration::from_millis(300),
        statement_timeout: Duration::from_secs(20),
        ..test_api_settings()
    })
    .await;
    // ACCESS EXCLUSIVE blocks reads too, so a GET waits on it.
    let lock = TableLock::take(&app.db, "ACCESS EXCLUSIVE");

    let started = Instant::now();
    let error = error_of(app.get("/orders/1").await, StatusCode::SERVICE_UNAVAILABLE).await;

    assert_eq!(error["code"], "timeout");
    assert!(started.elapsed() < Duration::from_secs(5));
    lock.release();
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_pool_wait_briefly_then_get_a_503() {
    let app = spawn_app_with(api::ApiSettings {
        pool_size: 1,
        db_wait: Duration::from_millis(300),
        ..test_api_settings()
    })
    .await;
    let mut lock = TableLock::take(&app.db, "ACCESS EXCLUSIVE");
    let client = app.client.clone();
    let blocked_url = app.url("/orders/1");
    let blocked = tokio::spawn(async move { client.get(blocked_url).send().await });
    lock.wait_for_a_waiter().await;

    let error = error_of(app.get("/orders/2").await, StatusCode::SERVICE_UNAVAILABLE).await;
    assert_eq!(error["code"], "database_unavailable");

    lock.release();
    let first = blocked.await.expect("task").expect("response");
    assert_eq!(first.status(), StatusCode::NOT_FOUND);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_an_in_flight_request_finish() {
    let app = spawn_app().await;
    let order: Value = app
        .post_order(&order_json("Ada"), None)
        .await
        .json()
        .await
        .expect("JSON");
    let url = app.url(&format!("/orders/{}", order["id"]));
    let mut lock = TableLock::take(&app.db, "ACCESS EXCLUSIVE");
    let client = app.client.clone();
    let in_flight = tokio::spawn(async move { client.get(url).send().await });
    lock.wait_for_a_waiter().await;

    app.shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(200)).await;
    lock.release();

    let response = in_flight.await.expect("task").expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    let addr = app.addr;
    app.stop().await;
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no longer listening"
    );
}

/// A child process that is killed if the test fails before waiting for it.
struct ChildGuard(Option<std::process::Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `serve` as deployed: the binary, its environment, SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serve_command_takes_orders_and_exits_0_on_sigterm() {
    let db = TestDb::new();
    let mut guard = ChildGuard(None);
    let child = guard.0.insert(
        Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
            .arg("serve")
            .env("DATABASE_URL", &db.url)
            .env("API_ADDR", "127.0.0.1:0")
            .env("METRICS_ADDR", "127.0.0.1:0")
            .env("JOB_MAX_ATTEMPTS", "5")
            .env("LINK_SIGNING_KEY", crate::support::app::LINK_SIGNING_KEY)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start outbox-relay serve"),
    );
    let stdout = child.stdout.take().expect("stdout");
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    });
    let line = tokio::time::timeout(Duration::from_secs(30), line)
        .await
        .expect("serve prints its address within 30s")
        .expect("task")
        .expect("read stdout");
    let base = line
        .trim()
        .rsplit(' ')
        .next()
        .expect("an address")
        .to_owned();
    assert!(base.starts_with("http://127.0.0.1:"), "{line}");

    let client = http_client_with_key(&cli_api_key(&db.url, "serve", "orders:place"));
    let response = client
        .post(format!("{base}/orders"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&order_json("Ada")).expect("JSON"))
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), StatusCode::CREATED);
    let order: Value = response.json().await.expect("JSON");
    assert!(
        order["jobs"]
            .as_array()
            .expect("jobs")
            .iter()
            .all(|j| j["max_attempts"] == 5),
        "JOB_MAX_ATTEMPTS applies: {order}"
    );

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(killed.success());
    let mut child = guard.0.take().expect("child");
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("task")
        .expect("wait for serve");
    assert_eq!(status.code(), Some(0), "a clean shutdown exits 0");
}

#[test]
fn the_serve_command_refuses_a_bad_api_addr_naming_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .arg("serve")
        .env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/nowhere")
        .env("API_ADDR", "localhost-ish")
        .output()
        .expect("run outbox-relay");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("API_ADDR") && err.contains("localhost-ish"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_json_is_an_openapi_3_1_document_of_the_public_routes_without_a_key() {
    let app = spawn_app().await;
    let response = crate::support::app::http_client()
        .get(app.url("/openapi.json"))
        .send()
        .await
        .expect("GET /openapi.json");
    assert_eq!(response.status(), StatusCode::OK);
    let document: Value = response.json().await.expect("JSON");
    assert_eq!(document["openapi"], "3.1.0");
    for (path, method) in [
        ("/orders", "post"),
        ("/orders/{id}", "get"),
        ("/orders/{id}/receipt.pdf", "get"),
        ("/orders/{id}/effects", "get"),
        ("/orders/{id}/{action}", "post"),
        ("/healthz", "get"),
        ("/openapi.json", "get"),
    ] {
        assert!(
            document["paths"][path][method].is_object(),
            "{method} {path} is missing"
        );
    }
    assert_eq!(
        document["components"]["securitySchemes"]["api_key"]["scheme"],
        "bearer"
    );
    // The ledger's answers are null until the job is done: the schema says so.
    let entry = &document["components"]["schemas"]["EffectEntry"]["properties"];
    for field in ["smtp_reply", "stream_seq", "pdf_sha256", "lease_token"] {
        let types = entry[field]["type"].as_array();
        assert!(
            types.is_some_and(|t| t.iter().any(|t| t == "null")),
            "{field}: {}",
            entry[field]
        );
    }
    app.stop().await;
}
