//! Order placement through the API, next to its ceiling: pgbench running the
//! same inserts (order, two items, three jobs, the NOTIFY) in one transaction
//! per order, with as many clients, on the same database.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use diesel::prelude::*;
use tokio_util::sync::CancellationToken;

use super::BenchArgs;
use super::report::Latency;
use crate::api::{self, ApiSettings, Application};
use crate::http_server::ConnectionLimits;

#[derive(Debug, Clone)]
pub struct Placement {
    pub clients: usize,
    pub api_orders_per_second: f64,
    pub api_errors: u64,
    /// Time to a `201` of each order placed in the run above.
    pub api_latency: Latency,
    /// The same load again while half-open connections hold the server.
    pub half_open: Option<HalfOpenRun>,
    /// `None` when pgbench is not installed.
    pub pgbench_orders_per_second: Option<f64>,
}

/// Order placement while `connections` clients each hold a connection open
/// after sending a request line and one header.
#[derive(Debug, Clone)]
pub struct HalfOpenRun {
    pub connections: usize,
    pub orders_per_second: f64,
    pub errors: u64,
    pub latency: Latency,
}

/// What a half-open client sends: never the blank line that ends the head.
const PARTIAL_HEAD: &[u8] = b"POST /orders HTTP/1.1\r\nHost: bench.example\r\n";

const ORDER: &str = r#"{"customer_email":"ada@example.com","customer_name":"Ada Lovelace","currency":"EUR","items":[{"sku":"TEA-1","name":"Green tea","quantity":2,"unit_price_cents":450},{"sku":"MUG-2","name":"Mug","quantity":1,"unit_price_cents":1200}]}"#;

/// The same writes `place_order` makes for the order above, as one pgbench
/// transaction: the order, its items, its `order.placed` event and its three
/// jobs (the email and the webhook with their ordering keys). The key locks
/// `place_order` also takes are left out: they write nothing, and taking them
/// here would need the same two extra statements.
const PGBENCH_SCRIPT: &str = r"BEGIN;
INSERT INTO orders (customer_email, customer_name, currency, total_cents) VALUES ('ada@example.com', 'Ada Lovelace', 'EUR', 2100) RETURNING id AS order_id \gset
INSERT INTO order_items (order_id, sku, name, quantity, unit_price_cents) VALUES (:order_id, 'TEA-1', 'Green tea', 2, 450), (:order_id, 'MUG-2', 'Mug', 1, 1200);
INSERT INTO order_events (order_id, seq, type) VALUES (:order_id, 1, 'order.placed') RETURNING id AS event_id \gset
INSERT INTO jobs (order_id, kind, payload, max_attempts, ordering_key) VALUES (:order_id, 'confirmation_email', jsonb_build_object('order_id', :order_id, 'event_id', :event_id), 8, 'order-' || :order_id || '-emails'), (:order_id, 'receipt_pdf', jsonb_build_object('order_id', :order_id), 8, NULL), (:order_id, 'order_webhook', jsonb_build_object('order_id', :order_id, 'event_id', :event_id), 8, 'order-' || :order_id || '-webhooks') RETURNING id;
SELECT pg_notify('outbox_jobs', kind) FROM unnest(ARRAY['confirmation_email', 'order_webhook', 'receipt_pdf']) AS kind;
COMMIT;
";

pub async fn measure(url: &str, args: &BenchArgs) -> anyhow::Result<Placement> {
    let clients = args.api_clients;
    let duration = args.api_duration;

    truncate(url).await?;
    let half_open = fitting_half_open(args.half_open);
    let settings = ApiSettings {
        pool_size: u32::try_from(clients).unwrap_or(16).clamp(1, 64),
        connections: ConnectionLimits {
            // Long enough that no half-open client is dropped during its run:
            // this measures the cost of holding them, not of dropping them.
            header_timeout: args.api_duration * 4 + Duration::from_secs(30),
            max_connections: half_open + clients + 64,
            ..ConnectionLimits::default()
        },
        ..ApiSettings::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let app = Application::build(api::connect(url, &settings), settings, listener)?;
    let app_addr = app.local_addr();
    let endpoint = format!("http://{app_addr}/orders");
    let stop = CancellationToken::new();
    let server = tokio::spawn(app.run_until_stopped(stop.clone()));

    crate::effects::webhook::ensure_crypto_provider();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(clients)
        .build()
        .context("building the load generator's client")?;
    // Warm-up: connections, prepared plans, the pool.
    load(&client, &endpoint, clients, Duration::from_millis(500)).await;
    truncate(url).await?;
    let unloaded = load(&client, &endpoint, clients, duration).await;
    let half_open = if half_open > 0 {
        let held = hold_half_open(app_addr, half_open).await?;
        truncate(url).await?;
        let loaded = load(&client, &endpoint, clients, duration).await;
        drop(held);
        Some(HalfOpenRun {
            connections: half_open,
            orders_per_second: loaded.rate(),
            errors: loaded.errors,
            latency: loaded.latency(),
        })
    } else {
        None
    };
    stop.cancel();
    server.await??;

    truncate(url).await?;
    let pgbench = tokio::task::spawn_blocking({
        let url = url.to_owned();
        move || pgbench(&url, clients, duration)
    })
    .await?;
    let pgbench = match pgbench {
        Ok(rate) => Some(rate),
        Err(error) => {
            eprintln!("  pgbench ceiling skipped: {error:#}");
            None
        }
    };
    Ok(Placement {
        clients,
        api_orders_per_second: unloaded.rate(),
        api_errors: unloaded.errors,
        api_latency: unloaded.latency(),
        half_open,
        pgbench_orders_per_second: pgbench,
    })
}

/// `wanted`, or fewer when this process's open-files limit cannot hold them:
/// each costs two descriptors here, the client's and the server's.
fn fitting_half_open(wanted: usize) -> usize {
    let limit = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| {
            let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
            line.trim_start_matches("Max open files")
                .split_whitespace()
                .next()?
                .parse::<usize>()
                .ok()
        });
    match limit {
        Some(limit) if wanted * 2 + 1024 > limit => {
            let fitting = limit.saturating_sub(1024) / 2;
            eprintln!(
                "  open-files limit {limit}: holding {fitting} half-open connections instead of {wanted}"
            );
            fitting
        }
        _ => wanted,
    }
}

/// Opens `n` connections that send [`PARTIAL_HEAD`] and then nothing.
async fn hold_half_open(
    addr: std::net::SocketAddr,
    n: usize,
) -> anyhow::Result<Vec<tokio::net::TcpStream>> {
    use tokio::io::AsyncWriteExt as _;
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .context("opening a half-open connection")?;
        stream.write_all(PARTIAL_HEAD).await?;
        held.push(stream);
    }
    Ok(held)
}

/// What one load run saw.
struct LoadRun {
    ok: u64,
    errors: u64,
    elapsed: Duration,
    /// Microseconds to each `201`, unsorted.
    micros: Vec<u64>,
}

impl LoadRun {
    fn rate(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64()
    }
    fn latency(&self) -> Latency {
        let mut sorted = self.micros.clone();
        sorted.sort_unstable();
        Latency::from_sorted_micros(&sorted)
    }
}

/// `clients` loops posting orders for `duration`.
async fn load(
    client: &reqwest::Client,
    endpoint: &str,
    clients: usize,
    duration: Duration,
) -> LoadRun {
    let ok = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (client, endpoint) = (client.clone(), endpoint.to_owned());
        let (ok, errors) = (Arc::clone(&ok), Arc::clone(&errors));
        tasks.spawn(async move {
            let mut micros = Vec::new();
            while Instant::now() < deadline {
                let sent_at = Instant::now();
                let sent = client
                    .post(&endpoint)
                    .header("content-type", "application/json")
                    .body(ORDER)
                    .send()
                    .await;
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

async fn truncate(url: &str) -> anyhow::Result<()> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut conn = PgConnection::establish(&url)?;
        diesel::sql_query("TRUNCATE orders, order_items, order_events, jobs, receipts")
            .execute(&mut conn)?;
        diesel::sql_query("VACUUM ANALYZE orders").execute(&mut conn)?;
        Ok(())
    })
    .await?
}

/// Orders per second of pgbench running [`PGBENCH_SCRIPT`] with `clients` clients.
fn pgbench(url: &str, clients: usize, duration: Duration) -> anyhow::Result<f64> {
    let script =
        std::env::temp_dir().join(format!("outbox-relay-bench-{}.sql", std::process::id()));
    std::fs::write(&script, PGBENCH_SCRIPT)?;
    let output = Command::new("pgbench")
        .args(["-n", "-c", &clients.to_string(), "-j", "2", "-T"])
        .arg(duration.as_secs().max(1).to_string())
        .arg("-f")
        .arg(&script)
        .arg(url)
        .output()
        .context("running pgbench (Debian: apt-get install postgresql-client)");
    let _ = std::fs::remove_file(&script);
    let output = output?;
    anyhow::ensure!(
        output.status.success(),
        "pgbench failed: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .find_map(|line| {
            let rest = line.trim().strip_prefix("tps = ")?;
            rest.split_whitespace().next()?.parse::<f64>().ok()
        })
        .context("pgbench printed no tps line")
}
