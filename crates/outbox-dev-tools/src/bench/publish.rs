//! `--effects real`, NATS part: a drain of `order_publish` jobs into a
//! JetStream stream, set against a raw async-nats loop publishing as many
//! messages, with the same headers and `--concurrency` in flight, to the same
//! server in the same run. The ratio is what the outbox costs over
//! publishing directly: claiming, loading the order, writing outcomes.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream;
use diesel::prelude::*;
use diesel::sql_types::BigInt;
use futures_util::StreamExt as _;

use super::BenchArgs;
use super::drain::{self, Workload};
use super::report::DrainRun;
use crate::effects::nats::{Publication, headers};

/// The bench's endpoint; its row names the stream the drain publishes to.
const ENDPOINT: &str = "bench-nats";

/// Both halves of one run.
#[derive(Debug, Clone)]
pub struct PublishRun {
    pub drain: DrainRun,
    pub raw_per_second: f64,
}

impl PublishRun {
    /// The relay's jobs/s over the raw loop's messages/s.
    pub fn ratio(&self) -> f64 {
        if self.raw_per_second > 0.0 {
            self.drain.jobs_per_second() / self.raw_per_second
        } else {
            0.0
        }
    }
}

/// Drains `args.real_jobs` publish jobs into a fresh stream on
/// `args.nats_url`, then runs the raw loop; the stream is deleted after.
/// `None` (said on stderr) when no NATS server answers there.
pub async fn measure(
    url: &str,
    args: &BenchArgs,
    batch: usize,
) -> anyhow::Result<Option<PublishRun>> {
    let nats_url = args.nats_url.clone();
    let Ok(client) = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .connect(nats_url.as_str())
        .await
    else {
        eprintln!("  publish drain: SKIPPED, no NATS server answers on {nats_url}");
        return Ok(None);
    };
    let js = jetstream::new(client);
    let tag = format!("{}_{:08x}", std::process::id(), fastrand::u32(..));
    let (stream, prefix) = (format!("BENCH_{tag}"), format!("bench{tag}"));
    js.create_stream(jetstream::stream::Config {
        name: stream.clone(),
        subjects: vec![format!("{prefix}.>")],
        ..Default::default()
    })
    .await
    .with_context(|| format!("creating stream {stream} on {nats_url}"))?;
    let result = run(url, args, batch, &js, &stream, &prefix).await;
    let _ = js.delete_stream(&stream).await;
    result.map(Some)
}

async fn run(
    url: &str,
    args: &BenchArgs,
    batch: usize,
    js: &jetstream::Context,
    stream: &str,
    prefix: &str,
) -> anyhow::Result<PublishRun> {
    let (owned_url, nats_url) = (url.to_owned(), args.nats_url.clone());
    let (stream_name, prefix_name) = (stream.to_owned(), prefix.to_owned());
    tokio::task::spawn_blocking(move || {
        let mut conn = PgConnection::establish(&owned_url)?;
        diesel::sql_query(
            "INSERT INTO endpoints (name, url, secret, stream, subject_prefix) \
             VALUES ($1, $2, 'unused', $3, $4) \
             ON CONFLICT (name) DO UPDATE SET url = $2, stream = $3, subject_prefix = $4",
        )
        .bind::<diesel::sql_types::Text, _>(ENDPOINT)
        .bind::<diesel::sql_types::Text, _>(&nats_url)
        .bind::<diesel::sql_types::Text, _>(&stream_name)
        .bind::<diesel::sql_types::Text, _>(&prefix_name)
        .execute(&mut conn)?;
        anyhow::Ok(())
    })
    .await??;

    let workload = Workload {
        label: format!("{batch}, NATS publishes"),
        jobs: args.real_jobs,
        kinds: "order_publish".to_owned(),
        env: vec![],
        enqueue: enqueue_publishes,
        keys: None,
        pin: None,
    };
    let (owned_url, concurrency) = (url.to_owned(), args.concurrency);
    let drain =
        tokio::task::spawn_blocking(move || drain::run(&owned_url, &workload, concurrency, batch))
            .await??;
    let mut info = js.get_stream(stream).await?;
    let stored = info.info().await?.state.messages;
    anyhow::ensure!(
        stored == drain.jobs as u64,
        "the stream holds {stored} messages for {} publish jobs",
        drain.jobs
    );

    let raw_per_second = raw_loop(js, stream, prefix, drain.jobs, args.concurrency).await?;
    Ok(PublishRun {
        drain,
        raw_per_second,
    })
}

/// Publishes `n` messages like the relay's (headers, a body of the same
/// size), `concurrency` awaiting their PubAck at once; messages per second.
async fn raw_loop(
    js: &jetstream::Context,
    stream: &str,
    prefix: &str,
    n: usize,
    concurrency: usize,
) -> anyhow::Result<f64> {
    let body = vec![b'x'; 700];
    let started = Instant::now();
    let results: Vec<anyhow::Result<()>> = futures_util::stream::iter(0..n)
        .map(|i| {
            let body = body.clone();
            async move {
                let id = format!("raw-{i}");
                let publication = Publication {
                    subject: format!("{prefix}.raw.{i}"),
                    message_id: &id,
                    stream,
                    traceparent: None,
                    body,
                };
                js.publish_with_headers(
                    publication.subject.clone(),
                    headers(&publication),
                    publication.body.clone().into(),
                )
                .await?
                .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let seconds = started.elapsed().as_secs_f64();
    results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    Ok(n as f64 / seconds.max(f64::EPSILON))
}

/// `jobs` orders, each with its `order.placed` event and one order_publish
/// job to the bench's endpoint, in one transaction.
fn enqueue_publishes(
    conn: &mut PgConnection,
    jobs: usize,
) -> anyhow::Result<super::stats::EnqueueMarks> {
    let orders = i64::try_from(jobs).unwrap_or(i64::MAX);
    super::enqueue_timed(
        conn,
        "jobs, order_items, order_events, orders, receipts",
        "order_publish",
        |conn| {
            diesel::sql_query(
                "WITH placed AS ( \
                     INSERT INTO orders (customer_email, customer_name, currency, total_cents) \
                     SELECT 'customer' || g || '@example.com', 'Customer ' || g, 'EUR', 900 \
                     FROM generate_series(1, $1) AS g \
                     RETURNING id), \
                 items AS ( \
                     INSERT INTO order_items (order_id, sku, name, quantity, unit_price_cents) \
                     SELECT id, 'TEA-1', 'Green tea', 2, 450 FROM placed), \
                 events AS ( \
                     INSERT INTO order_events (order_id, seq, type) \
                     SELECT id, 1, 'order.placed' FROM placed \
                     RETURNING id, order_id) \
                 INSERT INTO jobs (order_id, kind, payload, ordering_key) \
                 SELECT ev.order_id, 'order_publish', \
                        jsonb_build_object('order_id', ev.order_id, 'event_id', ev.id, \
                                           'endpoint_id', e.id), \
                        'endpoint:' || e.id || ':order:' || ev.order_id \
                 FROM events ev, endpoints e WHERE e.name = 'bench-nats'",
            )
            .bind::<BigInt, _>(orders)
            .execute(conn)
            .map(drop)
        },
    )
}
