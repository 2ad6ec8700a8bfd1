//! The order API over real HTTP, on port 0, against a database of its own.

use std::net::SocketAddr;
use std::time::Duration;

use diesel::prelude::*;
use order_service::api::{self, ApiDatabase, ApiSettings};
use order_service::api_keys::{self, KeyName, Scope};
use order_service::links::{DEFAULT_RECEIPT_LINK_TTL, ReceiptLinks};
use order_service::schema::{jobs_all, order_items, orders};
use order_service::server::Application;
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::TestDb;

/// The `LINK_SIGNING_KEY` of every API, relay and process the tests start.
pub const LINK_SIGNING_KEY: &str = "test-link-signing-key/32-bytes-at-least";

/// Receipt links signed with [`LINK_SIGNING_KEY`], valid for the default 30 days.
pub fn test_receipt_links() -> ReceiptLinks {
    ReceiptLinks::new(LINK_SIGNING_KEY.as_bytes(), DEFAULT_RECEIPT_LINK_TTL)
        .expect("the test key is long enough")
}

/// Settings for tests: the queue-depth gauge re-counted on every scrape, a
/// short shutdown grace, receipt links checked with the tests' key.
pub fn test_api_settings() -> ApiSettings {
    ApiSettings {
        queue_depth_ttl: Duration::ZERO,
        shutdown_grace: Duration::from_secs(5),
        receipt_links: Some(test_receipt_links()),
        ..ApiSettings::default()
    }
}

/// A running API and the database behind it.
pub struct TestApp {
    pub addr: SocketAddr,
    /// The API's `/metrics` listener (`METRICS_ADDR`), apart from `addr`.
    pub metrics_addr: SocketAddr,
    pub db: TestDb,
    /// Sends [`TestApp::api_key`] with every request.
    pub client: reqwest::Client,
    /// A key with `orders:*`, named `test`.
    pub api_key: String,
    pub shutdown: CancellationToken,
    handle: tokio::task::JoinHandle<std::io::Result<()>>,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(test_api_settings()).await
}

pub async fn spawn_app_with(settings: ApiSettings) -> TestApp {
    let db = TestDb::new();
    let database = api::connect(&db.url, &settings);
    spawn_app_on(db, database, settings).await
}

/// The API on `database`, which need not be `db` (tests of a database outage
/// give it one that cannot connect, and still count rows in `db`).
pub async fn spawn_app_on(db: TestDb, database: ApiDatabase, settings: ApiSettings) -> TestApp {
    super::init_tracing();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind port 0");
    let metrics = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind port 0");
    let app = Application::build(database, settings, listener)
        .expect("build the API")
        .with_metrics(metrics);
    let addr = app.local_addr();
    let metrics_addr = app.metrics_addr().expect("a metrics listener");
    let shutdown = CancellationToken::new();
    let handle = tokio::spawn(app.run_until_stopped(shutdown.clone()));
    let api_key = create_api_key(&db.url, "test", &[Scope::All]);
    TestApp {
        addr,
        metrics_addr,
        db,
        client: http_client_with_key(&api_key),
        api_key,
        shutdown,
        handle,
    }
}

/// Creates an API key named `name` with `scopes` in the database at `url`;
/// the key's text.
pub fn create_api_key(url: &str, name: &str, scopes: &[Scope]) -> String {
    let mut conn = PgConnection::establish(url).expect("connect to create an API key");
    let name = KeyName::parse(name).expect("a valid key name");
    api_keys::create_key(&mut conn, &name, scopes, None)
        .expect("create an API key")
        .secret
        .expose()
        .to_owned()
}

/// A key made by `outbox-relay keys create --json` in the database at
/// `url`, as an operator would; the key's text.
pub fn cli_api_key(url: &str, name: &str, scopes: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args([
            "keys", "create", "--name", name, "--scopes", scopes, "--json",
        ])
        .env("DATABASE_URL", url)
        .output()
        .expect("run outbox-relay keys create");
    assert!(
        out.status.success(),
        "keys create: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let created: Value = serde_json::from_slice(&out.stdout).expect("keys create --json");
    created["key"].as_str().expect("a key").to_owned()
}

/// [`http_client`] sending `Authorization: Bearer <api_key>` with every
/// request (a request's own Authorization header replaces it).
pub fn http_client_with_key(api_key: &str) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut bearer =
        HeaderValue::from_str(&format!("Bearer {api_key}")).expect("a key is a header value");
    bearer.set_sensitive(true);
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .default_headers(HeaderMap::from_iter([(AUTHORIZATION, bearer)]))
        .build()
        .expect("HTTP client")
}

/// A plain-HTTP client. reqwest is built without a default TLS crypto
/// provider, and building a client needs one even for http://.
pub fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("HTTP client")
}

/// Rows in the order tables and the jobs table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rows {
    pub orders: i64,
    pub items: i64,
    pub jobs: i64,
}

impl Rows {
    pub const NONE: Rows = Rows {
        orders: 0,
        items: 0,
        jobs: 0,
    };
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// `path` on the metrics listener.
    pub fn metrics_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.metrics_addr)
    }

    pub async fn post_order(&self, body: &Value, key: Option<&str>) -> reqwest::Response {
        let bytes = serde_json::to_vec(body).expect("serialize body");
        self.post_raw(Some("application/json"), bytes, key).await
    }

    pub async fn post_raw(
        &self,
        content_type: Option<&str>,
        body: Vec<u8>,
        key: Option<&str>,
    ) -> reqwest::Response {
        let mut request = self.client.post(self.url("/orders")).body(body);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        request.send().await.expect("POST /orders")
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(self.url(path))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    pub fn rows(&self) -> Rows {
        let mut conn = self.db.conn();
        Rows {
            orders: orders::table.count().get_result(&mut conn).expect("count"),
            items: order_items::table
                .count()
                .get_result(&mut conn)
                .expect("count"),
            jobs: jobs_all::table
                .count()
                .get_result(&mut conn)
                .expect("count"),
        }
    }

    /// Asks for shutdown and waits for the server to return.
    pub async fn stop(self) {
        drop(self.stop_keeping_db().await);
    }

    /// Stops the server and hands back its database, to start another
    /// server on it (a restart).
    pub async fn stop_keeping_db(self) -> TestDb {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.handle)
            .await
            .expect("the API stops within 30s")
            .expect("the API task did not panic")
            .expect("the API returned Ok");
        self.db
    }
}

/// Asserts `response` is a JSON error with `status`, in the contract's shape,
/// and returns its `error` object.
pub async fn error_of(response: reqwest::Response, status: StatusCode) -> Value {
    assert_eq!(response.status(), status, "status");
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        content_type.starts_with("application/json"),
        "content type {content_type:?}"
    );
    let body: Value = response.json().await.expect("JSON error body");
    let object = body.as_object().expect("a JSON object");
    assert_eq!(object.len(), 1, "only an error key: {body}");
    let error = &body["error"];
    assert!(error["code"].is_string(), "error.code: {body}");
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "error.message: {body}"
    );
    let allowed = ["code", "message", "field"];
    assert!(
        error
            .as_object()
            .expect("error is an object")
            .keys()
            .all(|k| allowed.contains(&k.as_str())),
        "unexpected keys: {body}"
    );
    error.clone()
}
