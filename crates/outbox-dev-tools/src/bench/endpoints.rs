//! `bench --endpoints`: what a slow endpoint costs a healthy one. Orders are
//! placed at a steady pace and fanned out to two endpoints with real local
//! HTTP receivers, one answering at once and one after `--slow-answer`; the
//! healthy endpoint's delivery latency (its receiver's arrival time minus the
//! job's enqueue) is measured alone and then beside the slow one, in the same
//! run, and the slow receiver counts the most calls it ever had open.
//!
//! The relay runs in this process, as the integration tests run it: the
//! receivers, the relay and PostgreSQL share the machine, which is part of
//! what the ratio measures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use diesel::prelude::*;
use tokio_util::sync::CancellationToken;

use super::BenchArgs;
use super::percentiles::Latency;
use crate::demo::sinks::webhook::{Answer, WebhookSink};
use crate::scratch::ScratchDatabase;
use order_service::db::{self, PoolOptions};
use order_service::effects::receipt::ReceiptSettings;
use order_service::effects::webhook::{WebhookConfig, WebhookSender};
use order_service::endpoints::spec::{EndpointName, EndpointUrl, EventTypes};
use order_service::endpoints::{NewEndpoint, SigningSecret, store};
use order_service::orders::order_enqueuer;
use order_service::orders::{NewOrder, place_order};
use order_service::schema::jobs_all;
use order_service::sealed::Keyring;
use order_service::worker_pool::{PoolSettings, WorkerPool};

/// Orders placed per second: a steady stream, as a shop sends them.
const PACE: f64 = 50.0;
/// The healthy endpoint's `max_in_flight`.
const FAST_MAX_IN_FLIGHT: i32 = 16;
/// The slow endpoint's `max_in_flight`.
pub const SLOW_MAX_IN_FLIGHT: i32 = 4;

/// One run's figures.
#[derive(Debug, Clone)]
pub struct FairnessRun {
    /// The healthy endpoint's delivery latency.
    pub fast: Latency,
    /// Calls the slow receiver got, and the most it had open at once.
    pub slow_calls: usize,
    pub slow_most_open: usize,
}

/// The healthy endpoint alone, then beside the slow one.
#[derive(Debug, Clone)]
pub struct Fairness {
    pub orders: usize,
    pub slow_answer: Duration,
    pub alone: FairnessRun,
    pub beside: FairnessRun,
}

impl Fairness {
    fn ratio(beside: f64, alone: f64) -> f64 {
        if alone > 0.0 {
            beside / alone
        } else {
            f64::NAN
        }
    }

    pub fn table(&self) -> String {
        let (a, b) = (&self.alone.fast, &self.beside.fast);
        format!(
            "endpoints: {} orders at {PACE}/s; the healthy endpoint (max_in_flight {FAST_MAX_IN_FLIGHT}) answers at once, \
             the slow one (max_in_flight {SLOW_MAX_IN_FLIGHT}) after {:.1}s\n\
             \x20 healthy endpoint delivery latency    p50 {:>9.1} ms   p99 {:>9.1} ms   alone\n\
             \x20                                      p50 {:>9.1} ms   p99 {:>9.1} ms   beside the slow one\n\
             \x20                                      p50 {:>8.2}x      p99 {:>8.2}x      beside / alone\n\
             \x20 slow endpoint: {} calls, at most {} open at once (max_in_flight {SLOW_MAX_IN_FLIGHT})",
            self.orders,
            self.slow_answer.as_secs_f64(),
            a.p50_ms,
            a.p99_ms,
            b.p50_ms,
            b.p99_ms,
            Self::ratio(b.p50_ms, a.p50_ms),
            Self::ratio(b.p99_ms, a.p99_ms),
            self.beside.slow_calls,
            self.beside.slow_most_open,
        )
    }

    pub fn json(&self) -> serde_json::Value {
        let latency = |l: &Latency| serde_json::json!({"samples": l.samples, "p50_ms": l.p50_ms, "p99_ms": l.p99_ms, "max_ms": l.max_ms});
        serde_json::json!({"endpoints": {
            "orders": self.orders,
            "orders_per_second": PACE,
            "slow_answer_ms": self.slow_answer.as_millis(),
            "fast_alone": latency(&self.alone.fast),
            "fast_beside_slow": latency(&self.beside.fast),
            "p50_ratio": Self::ratio(self.beside.fast.p50_ms, self.alone.fast.p50_ms),
            "p99_ratio": Self::ratio(self.beside.fast.p99_ms, self.alone.fast.p99_ms),
            "slow_calls": self.beside.slow_calls,
            "slow_most_open": self.beside.slow_most_open,
            "slow_max_in_flight": SLOW_MAX_IN_FLIGHT,
        }})
    }
}

/// Both runs, each on a scratch database of its own.
pub async fn measure(args: &BenchArgs) -> anyhow::Result<Fairness> {
    eprintln!("bench --endpoints: the healthy endpoint alone");
    let alone = run(args, false)
        .await
        .context("the healthy endpoint alone")?;
    eprintln!("bench --endpoints: beside the slow endpoint");
    let beside = run(args, true)
        .await
        .context("the healthy endpoint beside the slow one")?;
    anyhow::ensure!(
        beside.slow_calls > 0,
        "the slow endpoint was never called: nothing was measured beside it"
    );
    Ok(Fairness {
        orders: args.endpoint_orders,
        slow_answer: args.slow_answer,
        alone,
        beside,
    })
}

async fn run(args: &BenchArgs, with_slow: bool) -> anyhow::Result<FairnessRun> {
    let admin = args.database_url.clone();
    let scratch = tokio::task::spawn_blocking(move || -> anyhow::Result<ScratchDatabase> {
        let scratch = ScratchDatabase::create(&admin, "outbox_bench_endpoints")?;
        order_service::db::migrate_url(&scratch.url)?;
        Ok(scratch)
    })
    .await??;
    let fast = WebhookSink::start([], Answer::status(204), None).await?;
    let slow = WebhookSink::start([], Answer::Hang(args.slow_answer), None).await?;
    let url = scratch.url.clone();
    let (fast_url, slow_url) = (fast.url(), slow.url());
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut conn = db::establish(&url)?;
        add_endpoint(&mut conn, "healthy", &fast_url, FAST_MAX_IN_FLIGHT)?;
        if with_slow {
            add_endpoint(&mut conn, "slow", &slow_url, SLOW_MAX_IN_FLIGHT)?;
        }
        Ok(())
    })
    .await??;

    let stop = CancellationToken::new();
    let relay = start_relay(&scratch.url, args, &fast, &stop)?;
    let orders = args.endpoint_orders;
    let placing = place_paced(&scratch.url, orders);
    let placed = placing.await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while placed.is_ok() && fast.requests().len() < orders && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if with_slow && placed.is_ok() {
        // A full answer time and more: calls have ended and new ones begun.
        tokio::time::sleep(args.slow_answer + Duration::from_secs(3)).await;
    }
    stop.cancel();
    if tokio::time::timeout(Duration::from_secs(30), relay)
        .await
        .is_err()
    {
        eprintln!("bench --endpoints: the relay did not stop within 30s");
    }
    placed?;
    let received = fast.requests().len();
    anyhow::ensure!(
        received >= orders,
        "the healthy endpoint got {received} of {orders} deliveries in 2 minutes"
    );

    let url = scratch.url.clone();
    let requests = fast.requests();
    let latencies = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<u64>> {
        let mut conn = db::establish(&url)?;
        let created: std::collections::HashMap<i64, chrono::DateTime<chrono::Utc>> =
            jobs_all::table
                .filter(jobs_all::kind.eq("order_webhook"))
                .select((jobs_all::id, jobs_all::created_at))
                .load::<(i64, chrono::DateTime<chrono::Utc>)>(&mut conn)?
                .into_iter()
                .collect();
        let mut micros: Vec<u64> = requests
            .iter()
            .filter_map(|r| {
                let id: i64 = r
                    .header("webhook-id")?
                    .strip_prefix("order-webhook-")?
                    .parse()
                    .ok()?;
                let waited = r.at - *created.get(&id)?;
                u64::try_from(waited.num_microseconds()?).ok()
            })
            .collect();
        micros.sort_unstable();
        Ok(micros)
    })
    .await??;
    anyhow::ensure!(
        latencies.len() >= orders,
        "only {} of the healthy endpoint's deliveries could be matched to their jobs",
        latencies.len()
    );
    drop(scratch);
    Ok(FairnessRun {
        fast: Latency::from_sorted_micros(&latencies),
        slow_calls: slow.requests().len(),
        slow_most_open: slow.most_open(),
    })
}

fn add_endpoint(
    conn: &mut PgConnection,
    name: &str,
    url: &url::Url,
    max_in_flight: i32,
) -> anyhow::Result<()> {
    store::add(
        conn,
        &NewEndpoint {
            name: EndpointName::parse(name)?,
            url: EndpointUrl::parse(url.as_str(), true)?,
            event_types: EventTypes::ALL,
            rate_limit: None,
            max_in_flight,
            secret: SigningSecret::generate().context("no randomness for a secret")?,
            nats: None,
        },
        &Keyring::none(),
    )
    .with_context(|| format!("adding endpoint {name}"))?;
    Ok(())
}

/// A relay delivering `order_webhook` jobs, until `stop`.
fn start_relay(
    url: &str,
    args: &BenchArgs,
    fallback: &WebhookSink,
    stop: &CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    // Every delivery goes to an endpoint row; the relay is given a
    // WEBHOOK_URL anyway, as a relay still needs one today. Its timeout
    // outlasts the slow answer, as a receiver's 25 s answer is an answer.
    let sender = WebhookSender::new(&WebhookConfig {
        url: fallback.url(),
        secret: "bench-secret".to_owned(),
        timeout: args.slow_answer + Duration::from_secs(10),
        allow_private: true,
    })?;
    let pool = db::build_pool(
        url,
        &PoolOptions {
            size: u32::try_from(args.concurrency).unwrap_or(64).min(64) + 4,
            ..PoolOptions::default()
        },
    );
    let executor = Arc::new(order_service::effects::workers(
        pool.clone(),
        None,
        Some(sender),
        ReceiptSettings::default(),
    ));
    let mut settings = PoolSettings::new(
        format!("bench-endpoints-{}", std::process::id()),
        vec!["order_webhook".to_owned()],
    );
    settings.concurrency = args.concurrency;
    settings.batch_size = args.batch;
    // The slow calls still open at the end are the bench's, not a job's.
    settings.shutdown_grace = Duration::from_secs(1);
    let relay = WorkerPool::new(pool, url, settings, executor)?;
    Ok(tokio::spawn(relay.run_until_stopped(stop.clone())))
}

/// Places `n` orders at [`PACE`] a second, on a blocking thread.
async fn place_paced(url: &str, n: usize) -> anyhow::Result<()> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut conn = db::establish(&url)?;
        let order = NewOrder::parse(&serde_json::json!({
            "customer_email": "ada@example.com",
            "customer_name": "Ada Lovelace",
            "currency": "EUR",
            "items": [{"sku": "TEA-1", "name": "Green tea", "quantity": 2, "unit_price_cents": 450}],
        }))
        .map_err(|e| anyhow::anyhow!("the bench's order: {e}"))?;
        let enqueuer = order_enqueuer();
        let start = Instant::now();
        for i in 0..n {
            let due = start + Duration::from_secs_f64(i as f64 / PACE);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            place_order(&mut conn, &enqueuer, &order, None, 8)
                .with_context(|| format!("placing order {} of {n}", i + 1))?;
        }
        Ok(())
    })
    .await?
}
