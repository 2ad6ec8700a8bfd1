//! `bench --inbound`: payments arriving as Stripe-signed webhooks, against
//! the API's own `pay` transition, measured in one run on the same server.
//!
//! - Baseline: `POST /orders/{id}/pay` with a key and an Idempotency-Key, by
//!   `--api-clients` loops flat out, one order each.
//! - Saturation: `payment_intent.succeeded` events to `/inbound/{source}`,
//!   the same loops flat out, on fresh orders.
//! - Open loop: the same events at half the saturation rate, each sent at its
//!   slot whatever the answers before it did, on fresh orders again; the
//!   answers' p50 and p99 against [`TARGET_P99_MS`].
//!
//! - Reconcile: `--reconcile-events` payments that never arrived as
//!   webhooks, found in Stripe's event log (the demo's local stand-in) and
//!   applied by `Reconciler::source`, the code `inbox reconcile` runs: a
//!   page of 100 at a time, each event in its own transaction. Against the
//!   saturation's rate.
//!
//! Every answer must be `200` (`applied` for an event) and every order must
//! end `paid`, or the run fails: a rate of refusals measures nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use diesel::prelude::*;
use serde_json::json;
use tokio::sync::Mutex;

use super::BenchArgs;
use super::orders::{self, ApiUnderTest};
use super::percentiles::Latency;
use crate::demo::sinks::stripe_events::{StripeEventLog, payment_succeeded};
use order_service::db::{PoolOptions, build_pool};
use order_service::inbox::reconcile::Reconciler;
use order_service::inbox::reconcile::api_key;
use order_service::inbox::reconcile::stripe_events::{RetryPolicy, StripeEvents};
use order_service::inbox::source::{self, SourceKind, SourceMode};
use order_service::inbox::verify::stripe_signature;
use order_service::sealed::Keyring;

/// The answer's p99 an inbound event should stay under at half the maximum.
pub const TARGET_P99_MS: f64 = 25.0;
const SOURCE: &str = "bench-stripe";
/// A Stripe test-mode secret's shape; the key is the string itself.
const SECRET: &str = "whsec_bench0a1b2c3d4e5f60718293a4b5c6d7e8f9";
/// The total of [`orders::ORDER`]: 2 × 4.50 + 12.00 EUR.
const TOTAL_CENTS: i64 = 2_100;

/// What `--inbound` measured.
#[derive(Debug, Clone)]
pub struct InboundRun {
    pub events: usize,
    pub clients: usize,
    pub pay_per_second: f64,
    pub inbound_per_second: f64,
    pub open_loop_target_per_second: f64,
    pub open_loop_achieved_per_second: f64,
    pub open_loop_latency: Latency,
    pub reconcile_events: usize,
    pub reconcile_per_second: f64,
}

impl InboundRun {
    pub fn inbound_over_pay(&self) -> f64 {
        self.inbound_per_second / self.pay_per_second
    }

    pub fn reconcile_over_inbound(&self) -> f64 {
        self.reconcile_per_second / self.inbound_per_second
    }

    pub fn table(&self) -> String {
        let l = &self.open_loop_latency;
        format!(
            "inbound payments ({} events a run, {} clients; every answer 200, every event applied, every order paid)\n\
             \x20 pay through the API (saturation)   {:>9.0} orders/s\n\
             \x20 inbound Stripe events (saturation) {:>9.0} events/s   inbound/pay {:.2}\n\
             \x20 inbound open loop at 50%          {:>9.0} events/s asked, {:.0} achieved\n\
             \x20   answer p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms   (target p99 < {TARGET_P99_MS} ms: {})\n\
             \x20 reconciled from the event log      {:>9.0} events/s   reconcile/inbound {:.2} ({} events)",
            self.events,
            self.clients,
            self.pay_per_second,
            self.inbound_per_second,
            self.inbound_over_pay(),
            self.open_loop_target_per_second,
            self.open_loop_achieved_per_second,
            l.p50_ms,
            l.p99_ms,
            l.max_ms,
            if self.meets_target() { "met" } else { "missed" },
            self.reconcile_per_second,
            self.reconcile_over_inbound(),
            self.reconcile_events,
        )
    }

    pub fn meets_target(&self) -> bool {
        self.open_loop_latency.p99_ms < TARGET_P99_MS
    }

    pub fn json(&self) -> serde_json::Value {
        let l = &self.open_loop_latency;
        json!({
            "inbound": {
                "events": self.events,
                "clients": self.clients,
                "pay_per_second": self.pay_per_second,
                "inbound_per_second": self.inbound_per_second,
                "inbound_over_pay": self.inbound_over_pay(),
                "open_loop_target_per_second": self.open_loop_target_per_second,
                "open_loop_achieved_per_second": self.open_loop_achieved_per_second,
                "open_loop_samples": l.samples,
                "open_loop_p50_ms": l.p50_ms,
                "open_loop_p99_ms": l.p99_ms,
                "open_loop_max_ms": l.max_ms,
                "target_p99_ms": TARGET_P99_MS,
                "p99_over_target": l.p99_ms / TARGET_P99_MS,
                "meets_target": self.meets_target(),
                "reconcile_events": self.reconcile_events,
                "reconcile_per_second": self.reconcile_per_second,
                "reconcile_over_inbound": self.reconcile_over_inbound(),
            }
        })
    }
}

pub async fn measure(url: &str, args: &BenchArgs) -> anyhow::Result<InboundRun> {
    let events = args.inbound_events;
    let clients = args.api_clients.max(1);
    orders::truncate(url).await?;
    add_source(url).await?;
    let api = ApiUnderTest::start(
        url,
        clients,
        // Room for the open loop's requests in flight at once.
        256,
        Duration::from_secs(30),
        order_service::api::ApiAuth::Keys,
    )
    .await?;
    let client = orders::load_client(clients, api.api_key.as_deref())?;
    let base = format!("http://{}", api.addr);

    let result = async {
        let (paid, inbound, open, missed) = (
            place(&client, &base, events, clients).await?,
            place(&client, &base, events, clients).await?,
            place(&client, &base, events, clients).await?,
            place(&client, &base, args.reconcile_events, clients).await?,
        );
        let pay_elapsed = flat_out(clients, paid, |id| {
            let (client, base) = (client.clone(), base.clone());
            async move { pay(&client, &base, id).await }
        })
        .await?;
        let pay_per_second = events as f64 / pay_elapsed.as_secs_f64();
        eprintln!("  pay through the API: {pay_per_second:.0}/s");
        let inbound_elapsed = flat_out(clients, inbound, |id| {
            let (client, base) = (client.clone(), base.clone());
            async move { event(&client, &base, id).await }
        })
        .await?;
        let inbound_per_second = events as f64 / inbound_elapsed.as_secs_f64();
        eprintln!("  inbound events: {inbound_per_second:.0}/s");
        let target = inbound_per_second / 2.0;
        let (achieved, latency) = open_loop(&client, &base, open, target).await?;
        eprintln!(
            "  inbound open loop at {target:.0}/s: p50 {:.2} ms p99 {:.2} ms",
            latency.p50_ms, latency.p99_ms
        );
        let reconcile_per_second = reconcile(url, SOURCE, &missed, TOTAL_CENTS).await?;
        eprintln!("  reconciled from the event log: {reconcile_per_second:.0}/s");
        anyhow::Ok(InboundRun {
            events,
            clients,
            pay_per_second,
            inbound_per_second,
            open_loop_target_per_second: target,
            open_loop_achieved_per_second: achieved,
            open_loop_latency: latency,
            reconcile_events: args.reconcile_events,
            reconcile_per_second,
        })
    }
    .await;
    api.stop().await?;
    let run = result?;
    check_all_paid(
        url,
        events * 3 + args.reconcile_events,
        events * 2 + args.reconcile_events,
    )
    .await?;
    Ok(run)
}

async fn add_source(url: &str) -> anyhow::Result<()> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut conn = PgConnection::establish(&url)?;
        diesel::sql_query("TRUNCATE inbox_messages").execute(&mut conn)?;
        if source::find(&mut conn, SOURCE)?.is_none() {
            source::add(
                &mut conn,
                SOURCE,
                SourceKind::Stripe,
                SourceMode::Any,
                SECRET,
                &Keyring::none(),
            )
            .map_err(|e| anyhow::anyhow!("adding the bench's source: {e}"))?;
        }
        Ok(())
    })
    .await?
}

/// The bench source's API key, which the local event log takes.
const API_KEY: &str = "rk_test_bench0a1b2c3d4e5f60718293a4b5";

/// Reconciles source `source` against a log that pays every order of
/// `ids` (`total_cents` EUR each); the events applied a second. Every
/// event must be recovered, none found already stored.
pub async fn reconcile(
    url: &str,
    source_name: &str,
    ids: &[i64],
    total_cents: i64,
) -> anyhow::Result<f64> {
    let log = StripeEventLog::start(API_KEY).await?;
    let created = chrono::Utc::now().timestamp();
    for id in ids {
        log.add(payment_succeeded(
            &format!("evt_bench_reconcile_{id}"),
            created,
            *id,
            total_cents,
            "eur",
            &format!("pi_bench_reconcile_{id}"),
        ));
    }
    let (db, name) = (url.to_owned(), source_name.to_owned());
    tokio::task::spawn_blocking(move || {
        let mut conn = order_service::db::establish(&db)?;
        api_key::set_api_key(&mut conn, &name, API_KEY, &Keyring::none())
            .map_err(|e| anyhow::anyhow!("giving the bench's source an API key: {e}"))
    })
    .await??;
    let reconciler = Reconciler {
        pool: build_pool(
            url,
            &PoolOptions {
                size: 2,
                ..PoolOptions::default()
            },
        ),
        events: StripeEvents::new(&log.base_url(), RetryPolicy::default())?,
        keys: Keyring::none(),
        enqueuer: order_service::orders::order_enqueuer(),
        max_attempts: outbox_core::outbox::DEFAULT_MAX_ATTEMPTS,
    };
    let started = Instant::now();
    let report = reconciler
        .source(source_name, Some(Duration::from_secs(3600)))
        .await?;
    let elapsed = started.elapsed();
    anyhow::ensure!(
        report.recovered == ids.len() as u64 && report.already == 0,
        "reconcile recovered {} of {} events ({} already stored)",
        report.recovered,
        ids.len(),
        report.already
    );
    Ok(ids.len() as f64 / elapsed.as_secs_f64())
}

/// Places `n` orders through the API with `clients` loops; their ids.
async fn place(
    client: &reqwest::Client,
    base: &str,
    n: usize,
    clients: usize,
) -> anyhow::Result<Vec<i64>> {
    let endpoint = format!("{base}/orders");
    let ids = Arc::new(Mutex::new(Vec::with_capacity(n)));
    flat_out(clients, (0..n).collect(), |_| {
        let (client, endpoint, ids) = (client.clone(), endpoint.clone(), Arc::clone(&ids));
        async move {
            let response = orders::place_one(&client, &endpoint).await?;
            let order: serde_json::Value = response.json().await?;
            let id = order["id"].as_i64().context("the placed order has no id")?;
            ids.lock().await.push(id);
            Ok(())
        }
    })
    .await?;
    let ids = std::mem::take(&mut *ids.lock().await);
    Ok(ids)
}

/// `POST /orders/{id}/pay`, which must be answered `200`.
async fn pay(client: &reqwest::Client, base: &str, id: i64) -> anyhow::Result<()> {
    let response = client
        .post(format!("{base}/orders/{id}/pay"))
        .header("idempotency-key", format!("bench-pay-{id}"))
        .json(&json!({ "payment_reference": format!("pi_bench_pay_{id}") }))
        .send()
        .await?;
    anyhow::ensure!(
        response.status() == reqwest::StatusCode::OK,
        "paying order {id} was answered {}",
        response.status()
    );
    Ok(())
}

/// The `payment_intent.succeeded` that pays order `id`, as Stripe sends it.
fn intent_succeeded(id: i64) -> Vec<u8> {
    let body = json!({
        "id": format!("evt_bench_{id}"),
        "object": "event",
        "api_version": "2024-06-20",
        "created": chrono::Utc::now().timestamp(),
        "livemode": false,
        "pending_webhooks": 1,
        "type": "payment_intent.succeeded",
        "data": {"object": {
            "id": format!("pi_bench_{id}"),
            "object": "payment_intent",
            "amount": TOTAL_CENTS,
            "amount_received": TOTAL_CENTS,
            "currency": "eur",
            "status": "succeeded",
            "metadata": {"order_id": id.to_string()},
        }},
    });
    body.to_string().into_bytes()
}

/// Posts order `id`'s signed event; the answer must be `200` `applied`.
async fn event(client: &reqwest::Client, base: &str, id: i64) -> anyhow::Result<()> {
    let body = intent_succeeded(id);
    let signature = stripe_signature(SECRET, chrono::Utc::now().timestamp(), &body);
    let response = client
        .post(format!("{base}/inbound/{SOURCE}"))
        .header("content-type", "application/json")
        .header("stripe-signature", signature)
        .body(body)
        .send()
        .await?;
    let status = response.status();
    let answer: serde_json::Value = response.json().await.unwrap_or_default();
    anyhow::ensure!(
        status == reqwest::StatusCode::OK && answer["status"] == "applied",
        "the event paying order {id} was answered {status} {answer}"
    );
    Ok(())
}

/// Runs `each` on every item with `clients` loops, flat out; the time they
/// took. The first failure fails the run.
async fn flat_out<T, F, Fut>(clients: usize, items: Vec<T>, each: F) -> anyhow::Result<Duration>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let (work, queue) = tokio::sync::mpsc::channel::<Fut>(clients);
    let queue = Arc::new(Mutex::new(queue));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients.max(1) {
        let queue = Arc::clone(&queue);
        tasks.spawn(async move {
            loop {
                let next = queue.lock().await.recv().await;
                match next {
                    Some(job) => job.await?,
                    None => return anyhow::Ok(()),
                }
            }
        });
    }
    for item in items {
        // Every loop gone: one failed, and says why below.
        if work.send(each(item)).await.is_err() {
            break;
        }
    }
    drop(work);
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(started.elapsed())
}

/// Sends order `ids`' events at `rate` a second, event `i` at `i / rate`
/// from the start, each on a task of its own; the rate achieved and the
/// answers' latency.
async fn open_loop(
    client: &reqwest::Client,
    base: &str,
    ids: Vec<i64>,
    rate: f64,
) -> anyhow::Result<(f64, Latency)> {
    anyhow::ensure!(rate > 0.0, "no inbound rate to run the open loop at");
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, id) in ids.into_iter().enumerate() {
        let slot = started + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(slot.into()).await;
        let (client, base) = (client.clone(), base.to_owned());
        tasks.spawn(async move {
            let sent_at = Instant::now();
            event(&client, &base, id).await?;
            anyhow::Ok(u64::try_from(sent_at.elapsed().as_micros()).unwrap_or(u64::MAX))
        });
    }
    let mut micros = Vec::with_capacity(tasks.len());
    while let Some(done) = tasks.join_next().await {
        micros.push(done??);
    }
    let achieved = micros.len() as f64 / started.elapsed().as_secs_f64();
    micros.sort_unstable();
    Ok((achieved, Latency::from_sorted_micros(&micros)))
}

/// Every one of the `expected` orders is `paid`, and each of the `events`
/// was stored once as applied.
async fn check_all_paid(url: &str, expected: usize, events: usize) -> anyhow::Result<()> {
    #[derive(QueryableByName)]
    struct Counts {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        orders: i64,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        paid: i64,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        applied: i64,
    }
    let url = url.to_owned();
    let counts = tokio::task::spawn_blocking(move || -> anyhow::Result<Counts> {
        let mut conn = PgConnection::establish(&url)?;
        Ok(diesel::sql_query(
            "SELECT (SELECT count(*) FROM orders) AS orders, \
                    (SELECT count(*) FROM orders WHERE status = 'paid') AS paid, \
                    (SELECT count(*) FROM inbox_messages WHERE status = 'applied') AS applied",
        )
        .get_result(&mut conn)?)
    })
    .await??;
    let expected = i64::try_from(expected).unwrap_or(i64::MAX);
    anyhow::ensure!(
        counts.orders == expected && counts.paid == expected,
        "{} of {} orders ended paid ({expected} placed)",
        counts.paid,
        counts.orders
    );
    let events = i64::try_from(events).unwrap_or(i64::MAX);
    anyhow::ensure!(
        counts.applied == events,
        "{} inbound events stored as applied, {events} sent",
        counts.applied,
    );
    Ok(())
}
