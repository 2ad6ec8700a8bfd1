//! Order placement through the API, next to its ceiling: pgbench running the
//! same inserts (order, two items, its event, three jobs) in one transaction
//! per order, with as many clients, on the same database, and no NOTIFY at
//! all: the ceiling is the writes alone, whatever way the API wakes the relay.
//!
//! pgbench's own figure moves a lot from one minute to the next on a shared
//! machine, so it runs three times in the same window as the API's runs:
//! before them, between the plain and the half-open run, and after the
//! last; the API is set against pgbench's median, with its spread.

use std::process::Command;
use std::time::Duration;

use anyhow::Context as _;
use diesel::prelude::*;

use super::BenchArgs;
use super::drain::{process_cpu_seconds, server_cpu_seconds, waited_children_cpu_seconds};
use super::orders::{ApiUnderTest, load, load_client, truncate};
use super::percentiles::Latency;
use order_service::api::ApiAuth;

#[derive(Debug, Clone)]
pub struct Placement {
    pub clients: usize,
    pub api_orders_per_second: f64,
    pub api_errors: u64,
    /// Time to a `201` of each order placed in the run above.
    pub api_latency: Latency,
    /// The same load again while half-open connections hold the server.
    pub half_open: Option<HalfOpenRun>,
    /// What API keys cost placement: the same load against a server with
    /// keys and one with `API_AUTH=none`, in alternating slices.
    pub auth_cost: super::auth_cost::AuthCost,
    /// What a payment window costs placement: the same load against a
    /// server with `ORDER_PAYMENT_WINDOW` and the one without, in
    /// alternating slices.
    pub window_cost: super::window_cost::WindowCost,
    /// The median of [`Self::pgbench_runs`]; `None` when pgbench is not
    /// installed.
    pub pgbench_orders_per_second: Option<f64>,
    /// pgbench's orders per second before, between and after the API runs.
    pub pgbench_runs: Vec<f64>,
    /// WAL bytes per order of the API run and of the pgbench run.
    pub api_wal_bytes_per_order: Option<f64>,
    pub pgbench_wal_bytes_per_order: Option<f64>,
    /// CPU per order of the API run: the server's, and this process's (the
    /// API and its load generator, which share it).
    pub api_cpu: CpuPerOrder,
    /// CPU per order over pgbench's runs: the server's, and pgbench's own.
    pub pgbench_cpu: CpuPerOrder,
    /// The same load generator against a server that does no work: what
    /// HTTP alone costs of `api_cpu.client_us`. `None` when it failed.
    pub http_floor: Option<super::http_floor::HttpFloor>,
}

/// CPU per order placed, in microseconds, on either side of the connection.
/// On a machine the server shares with its client, a placement costs the
/// sum: this says which side the API's cost beyond pgbench's sits on.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuPerOrder {
    /// Every PostgreSQL process's CPU over the run; `None` when no server
    /// runs on this machine.
    pub server_us: Option<f64>,
    /// The client side's.
    pub client_us: Option<f64>,
}

/// CPU seconds spent, and orders placed, over one or more runs; a side
/// becomes `None` once a reading of it failed.
#[derive(Debug, Clone, Copy)]
struct CpuTally {
    server: Option<f64>,
    client: Option<f64>,
    orders: u64,
}

impl Default for CpuTally {
    fn default() -> Self {
        CpuTally {
            server: Some(0.0),
            client: Some(0.0),
            orders: 0,
        }
    }
}

impl CpuTally {
    /// Adds a run: the CPU readings before and after it, and its orders.
    fn add(
        &mut self,
        server: (Option<f64>, Option<f64>),
        client: (Option<f64>, Option<f64>),
        orders: u64,
    ) {
        let add = |total: Option<f64>, (before, after): (Option<f64>, Option<f64>)| {
            Some(total? + after? - before?)
        };
        self.server = add(self.server, server);
        self.client = add(self.client, client);
        self.orders += orders;
    }

    fn per_order(&self) -> CpuPerOrder {
        let per = |seconds: Option<f64>| {
            seconds
                .filter(|_| self.orders > 0)
                .map(|s| s * 1e6 / self.orders as f64)
        };
        CpuPerOrder {
            server_us: per(self.server),
            client_us: per(self.client),
        }
    }
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

/// The same writes `place_order` makes for the order above, as one pgbench
/// transaction: the order, its items, its `order.placed` event and its three
/// jobs (the email and the webhook with their ordering keys). The key locks
/// `place_order` also takes are left out: they write nothing, and taking them
/// here would need the same two extra statements. So is any NOTIFY: the
/// target is the API against the bare writes, and a NOTIFY inside the
/// transaction serialises every commit on the notify queue's lock. The WAL
/// bytes per order of both runs are reported side by side, as a check that
/// they write the same.
const PGBENCH_SCRIPT: &str = r"BEGIN;
INSERT INTO orders (customer_email, customer_name, currency, total_cents) VALUES ('ada@example.com', 'Ada Lovelace', 'EUR', 2100) RETURNING id AS order_id \gset
INSERT INTO order_items (order_id, sku, name, quantity, unit_price_cents) VALUES (:order_id, 'TEA-1', 'Green tea', 2, 450), (:order_id, 'MUG-2', 'Mug', 1, 1200);
INSERT INTO order_events (order_id, seq, type) VALUES (:order_id, 1, 'order.placed') RETURNING id AS event_id \gset
INSERT INTO jobs (order_id, kind, payload, max_attempts, ordering_key, has_dependents) VALUES (:order_id, 'confirmation_email', jsonb_build_object('order_id', :order_id, 'event_id', :event_id), 8, 'order-' || :order_id || '-emails', false), (:order_id, 'receipt_pdf', jsonb_build_object('order_id', :order_id), 8, NULL, true), (:order_id, 'order_webhook', jsonb_build_object('order_id', :order_id, 'event_id', :event_id), 8, 'order-' || :order_id || '-webhooks', false) RETURNING id;
COMMIT;
";

pub async fn measure(url: &str, args: &BenchArgs) -> anyhow::Result<Placement> {
    let clients = args.api_clients;
    let duration = args.api_duration;

    truncate(url).await?;
    let half_open = fitting_half_open(args.half_open);
    // Long enough that no half-open client is dropped during its run: this
    // measures the cost of holding them, not of dropping them.
    let api = ApiUnderTest::start(
        url,
        clients,
        half_open,
        args.api_duration * 4 + Duration::from_secs(30),
        ApiAuth::Keys,
    )
    .await?;
    let (app_addr, endpoint) = (api.addr, api.endpoint());

    order_service::effects::webhook::ensure_crypto_provider();
    let client = load_client(clients, api.api_key.as_deref())?;
    // Warm-up: connections, prepared plans, the pool.
    load(&client, &endpoint, clients, Duration::from_millis(500)).await;
    let mut pgbench = PgbenchRuns::default();
    pgbench.run(url, clients, duration, "before").await?;
    truncate(url).await?;
    let wal_before = wal_mark(url).await?;
    let (server_before, client_before) = (server_cpu_seconds(), process_cpu_seconds(None));
    let unloaded = load(&client, &endpoint, clients, duration).await;
    let mut api_cpu = CpuTally::default();
    api_cpu.add(
        (server_before, server_cpu_seconds()),
        (client_before, process_cpu_seconds(None)),
        unloaded.ok,
    );
    let api_wal = since(url, &wal_before).await?.wal_per_order();
    pgbench.run(url, clients, duration, "between").await?;
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
    let auth_cost = super::auth_cost::measure(url, &api, &client, clients, duration).await?;
    let window_cost = super::window_cost::measure(url, &api, &client, clients, duration).await?;
    let http_floor = match super::http_floor::api_answer(&client, &endpoint).await {
        Ok(answer) => super::http_floor::measure(&client, clients, duration, answer).await,
        Err(error) => Err(error),
    }
    .inspect_err(|error| eprintln!("  HTTP floor skipped: {error:#}"))
    .ok();
    api.stop().await?;
    pgbench.run(url, clients, duration, "after").await?;
    Ok(Placement {
        clients,
        api_orders_per_second: unloaded.rate(),
        api_errors: unloaded.errors,
        api_latency: unloaded.latency(),
        half_open,
        auth_cost,
        window_cost,
        pgbench_orders_per_second: pgbench.median(),
        pgbench_runs: pgbench.rates,
        api_wal_bytes_per_order: api_wal,
        pgbench_wal_bytes_per_order: pgbench.wal_bytes_per_order,
        api_cpu: api_cpu.per_order(),
        pgbench_cpu: pgbench.cpu.per_order(),
        http_floor,
    })
}

/// pgbench's runs of one placement measurement.
#[derive(Default)]
struct PgbenchRuns {
    rates: Vec<f64>,
    /// From the first run that measured it.
    wal_bytes_per_order: Option<f64>,
    /// pgbench failed (not installed, say): said once, not tried again.
    skipped: bool,
    cpu: CpuTally,
}

impl PgbenchRuns {
    /// One run on an emptied database; `when` names it in the progress line.
    async fn run(
        &mut self,
        url: &str,
        clients: usize,
        duration: Duration,
        when: &str,
    ) -> anyhow::Result<()> {
        if self.skipped {
            return Ok(());
        }
        truncate(url).await?;
        let wal_before = wal_mark(url).await?;
        let (server_before, client_before) = (server_cpu_seconds(), waited_children_cpu_seconds());
        let rate = tokio::task::spawn_blocking({
            let url = url.to_owned();
            move || pgbench(&url, clients, duration)
        })
        .await?;
        let (server_after, client_after) = (server_cpu_seconds(), waited_children_cpu_seconds());
        match rate {
            Ok(rate) => {
                let run = since(url, &wal_before).await?;
                self.cpu.add(
                    (server_before, server_after),
                    (client_before, client_after),
                    run.orders,
                );
                eprintln!("  pgbench {when} the API runs: {rate:.0} orders/s");
                self.rates.push(rate);
                if self.wal_bytes_per_order.is_none() {
                    self.wal_bytes_per_order = run.wal_per_order();
                }
            }
            Err(error) => {
                eprintln!("  pgbench ceiling skipped: {error:#}");
                self.skipped = true;
            }
        }
        Ok(())
    }

    fn median(&self) -> Option<f64> {
        median(&self.rates)
    }
}

/// The median of `values` (the mean of the middle two for an even count).
pub(super) fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// The WAL position now.
async fn wal_mark(url: &str) -> anyhow::Result<String> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<String> {
        let mut conn = PgConnection::establish(&url)?;
        Ok(super::stats::wal_lsn(&mut conn)?)
    })
    .await?
}

/// What a run left: the orders in the table (those placed since the last
/// truncate) and the WAL bytes written since its mark.
struct RunTotals {
    orders: u64,
    wal_bytes: f64,
}

impl RunTotals {
    /// `None` without an order.
    fn wal_per_order(&self) -> Option<f64> {
        (self.orders > 0).then(|| self.wal_bytes / self.orders as f64)
    }
}

/// [`RunTotals`] since the WAL position `from`.
async fn since(url: &str, from: &str) -> anyhow::Result<RunTotals> {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let (url, from) = (url.to_owned(), from.to_owned());
    tokio::task::spawn_blocking(move || -> anyhow::Result<RunTotals> {
        let mut conn = PgConnection::establish(&url)?;
        let to = super::stats::wal_lsn(&mut conn)?;
        let wal_bytes = super::stats::wal_bytes_between(&mut conn, &from, &to)? as f64;
        let orders: Count =
            diesel::sql_query("SELECT count(*) AS n FROM orders").get_result(&mut conn)?;
        Ok(RunTotals {
            orders: u64::try_from(orders.n).unwrap_or(0),
            wal_bytes,
        })
    })
    .await?
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
