//! Load through the order API: the API on a port of its own with a bench
//! key, the client that loads it, and a closed loop of placements. The
//! placement run (`placement.rs`), the API-keys comparison (`auth_cost.rs`),
//! the latency runs and the growth rows all load it the same way.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use diesel::prelude::*;
use tokio_util::sync::CancellationToken;

use super::percentiles::Latency;
use order_service::api::{self, ApiAuth, ApiSettings};
use order_service::api_keys;
use order_service::http_server::ConnectionLimits;
use order_service::server::Application;

pub(super) const ORDER: &str = r#"{"customer_email":"ada@example.com","customer_name":"Ada Lovelace","currency":"EUR","items":[{"sku":"TEA-1","name":"Green tea","quantity":2,"unit_price_cents":450},{"sku":"MUG-2","name":"Mug","quantity":1,"unit_price_cents":1200}]}"#;

/// The order API on a port of its own, in this process.
pub(super) struct ApiUnderTest {
    pub addr: std::net::SocketAddr,
    /// A key with `orders:*`, unless the server runs with `API_AUTH=none`.
    pub api_key: Option<String>,
    stop: CancellationToken,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl ApiUnderTest {
    /// Serves the API with a pool for `clients`, room for `idle` more
    /// connections, and `header_timeout` to receive a request's head.
    pub async fn start(
        url: &str,
        clients: usize,
        idle: usize,
        header_timeout: Duration,
        auth: ApiAuth,
    ) -> anyhow::Result<ApiUnderTest> {
        Self::serve(url, clients, idle, header_timeout, auth, None).await
    }

    /// The API with keys, placing every order under `payment_window`
    /// (`ORDER_PAYMENT_WINDOW`).
    pub async fn with_payment_window(
        url: &str,
        clients: usize,
        payment_window: Duration,
    ) -> anyhow::Result<ApiUnderTest> {
        let timeout = Duration::from_secs(30);
        Self::serve(
            url,
            clients,
            0,
            timeout,
            ApiAuth::Keys,
            Some(payment_window),
        )
        .await
    }

    async fn serve(
        url: &str,
        clients: usize,
        idle: usize,
        header_timeout: Duration,
        auth: ApiAuth,
        payment_window: Option<Duration>,
    ) -> anyhow::Result<ApiUnderTest> {
        let settings = ApiSettings {
            payment_window,
            pool_size: u32::try_from(clients).unwrap_or(16).clamp(1, 64),
            connections: ConnectionLimits {
                header_timeout,
                max_connections: idle + clients + 64,
                ..ConnectionLimits::default()
            },
            auth,
            // Unlimited: the bench measures the API, not the limiter's refusals.
            rate_limit: None,
            ..ApiSettings::default()
        };
        let api_key = match auth {
            ApiAuth::Keys => Some(bench_key(url).await?),
            ApiAuth::None => None,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let app = Application::build(api::connect(url, &settings), settings, listener)?;
        let addr = app.local_addr();
        let stop = CancellationToken::new();
        let server = tokio::spawn(app.run_until_stopped(stop.clone()));
        Ok(ApiUnderTest {
            addr,
            api_key,
            stop,
            server,
        })
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}/orders", self.addr)
    }

    pub async fn stop(self) -> anyhow::Result<()> {
        self.stop.cancel();
        self.server.await??;
        Ok(())
    }
}

/// A new key with every scope, named after this run.
async fn bench_key(url: &str) -> anyhow::Result<String> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<String> {
        let mut conn = PgConnection::establish(&url)?;
        let name = api_keys::KeyName::parse(&format!("bench-{:08x}", fastrand::u32(..)))
            .map_err(|e| anyhow::anyhow!("the bench key's name {e}"))?;
        let created = api_keys::create_key(&mut conn, &name, &[api_keys::Scope::All], None)
            .context("creating the bench's API key")?;
        Ok(created.secret.expose().to_owned())
    })
    .await?
}

/// An HTTP client that keeps a connection per load client, and sends
/// `api_key` with every request.
pub(super) fn load_client(
    clients: usize,
    api_key: Option<&str>,
) -> anyhow::Result<reqwest::Client> {
    order_service::effects::webhook::ensure_crypto_provider();
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(key) = api_key {
        let mut bearer = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))
            .context("the API key as a header")?;
        bearer.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, bearer);
    }
    reqwest::Client::builder()
        .pool_max_idle_per_host(clients)
        .default_headers(headers)
        .build()
        .context("building the load generator's client")
}

/// What one load run saw.
pub(super) struct LoadRun {
    pub ok: u64,
    pub errors: u64,
    pub elapsed: Duration,
    /// Microseconds to each `201`, unsorted.
    micros: Vec<u64>,
}

impl LoadRun {
    pub fn rate(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64()
    }
    pub fn latency(&self) -> Latency {
        let mut sorted = self.micros.clone();
        sorted.sort_unstable();
        Latency::from_sorted_micros(&sorted)
    }
}

/// A POST of [`ORDER`] to `endpoint`: what every placement of the bench sends.
pub(super) fn order_request(client: &reqwest::Client, endpoint: &str) -> reqwest::RequestBuilder {
    client
        .post(endpoint)
        .header("content-type", "application/json")
        .body(ORDER)
}

/// Places one order through `endpoint`: its answer, an error unless `201`.
pub(super) async fn place_one(
    client: &reqwest::Client,
    endpoint: &str,
) -> anyhow::Result<reqwest::Response> {
    let response = order_request(client, endpoint).send().await?;
    anyhow::ensure!(
        response.status() == reqwest::StatusCode::CREATED,
        "placing an order was answered {}",
        response.status()
    );
    Ok(response)
}

/// `clients` loops posting orders for `duration`.
pub(super) async fn load(
    client: &reqwest::Client,
    endpoint: &str,
    clients: usize,
    duration: Duration,
) -> LoadRun {
    let stop = CancellationToken::new();
    let timer = tokio::spawn({
        let stop = stop.clone();
        async move {
            tokio::time::sleep(duration).await;
            stop.cancel();
        }
    });
    let run = load_until(client.clone(), endpoint.to_owned(), clients, stop).await;
    timer.abort();
    run
}

/// `clients` loops posting orders until `stop` is cancelled (each finishes
/// the request it has in flight).
pub(super) async fn load_until(
    client: reqwest::Client,
    endpoint: String,
    clients: usize,
    stop: CancellationToken,
) -> LoadRun {
    let ok = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (client, endpoint) = (client.clone(), endpoint.clone());
        let (ok, errors) = (Arc::clone(&ok), Arc::clone(&errors));
        let stop = stop.clone();
        tasks.spawn(async move {
            let mut micros = Vec::new();
            while !stop.is_cancelled() {
                let sent_at = Instant::now();
                let sent = order_request(&client, &endpoint).send().await;
                match sent {
                    Ok(response) if response.status() == reqwest::StatusCode::CREATED => {
                        ok.fetch_add(1, Ordering::Relaxed);
                        micros
                            .push(u64::try_from(sent_at.elapsed().as_micros()).unwrap_or(u64::MAX));
                    }
                    _ => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            micros
        });
    }
    let mut micros = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        micros.extend(joined.unwrap_or_default());
    }
    LoadRun {
        ok: ok.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        elapsed: started.elapsed(),
        micros,
    }
}

pub(super) async fn truncate(url: &str) -> anyhow::Result<()> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut conn = PgConnection::establish(&url)?;
        diesel::sql_query(
            "TRUNCATE orders, order_items, order_events, jobs, jobs_done, job_claims, receipts",
        )
        .execute(&mut conn)?;
        // No ANALYZE of the emptied tables: statistics of zero rows make
        // every plan made during the run (each foreign-key check of an item,
        // an event or a job against `orders` among them) a sequential scan
        // that stays cached while the table grows, so each order cost more
        // than the last. TRUNCATE leaves the size unknown, and the planner
        // then probes the primary key.
        Ok(())
    })
    .await?
}
