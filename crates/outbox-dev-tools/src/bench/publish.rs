//! `--effects real` (or `--publish-only`), NATS part: a drain of
//! `order_publish` jobs into a JetStream stream, set against a raw async-nats
//! loop publishing as many messages to the same server in the same run, and
//! against the same jobs as `noop` (the relay's own ceiling for them). The
//! ratio to the raw loop is what the outbox costs over publishing directly:
//! claiming, loading the order, writing outcomes.
//!
//! The raw loop is the relay's publish without the relay: the body of a
//! message the drain stored (its size and bytes), the same headers
//! (`Nats-Msg-Id`, `Nats-Expected-Last-Subject-Sequence: 0`,
//! `Nats-Expected-Stream`, `content-type`), a subject of its own per message,
//! and at most `--concurrency` PubAcks awaited at once: as many as the
//! relay's slots allow it. A loop pipelining thousands of publishes would
//! measure another workload, one the relay never runs.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream;
use diesel::prelude::*;
use diesel::sql_types::BigInt;
use futures_util::StreamExt as _;

use super::BenchArgs;
use super::drain::{self, Workload};
use super::publish_floor::{self, ContractFloor};
use super::report::DrainRun;
use order_service::effects::nats::loader::MAX_PAIRS_PER_READ;
use order_service::effects::nats::{Publication, headers};

/// The bench's endpoint; its row names the stream the drain publishes to.
const ENDPOINT: &str = "bench-nats";

/// The three parts of one run.
#[derive(Debug, Clone)]
pub struct PublishRun {
    /// The publish jobs.
    pub drain: DrainRun,
    /// The same jobs (orders, events, payloads, ordering keys) as `noop`.
    pub noop: DrainRun,
    pub raw_per_second: f64,
    /// PubAcks the raw loop awaited at once (the relay's concurrency).
    pub raw_in_flight: usize,
    /// Bytes of each message's body, in the drain and the raw loop alike.
    pub body_bytes: usize,
    /// The bench process's CPU a raw message, µs (`None` where it is not
    /// readable): the raw loop is all this process runs meanwhile.
    pub raw_cpu_micros_per_message: Option<f64>,
    /// The drain's attempt and ledger rows, written again alone, and its
    /// reads, made again alone.
    pub floor: ContractFloor,
}

impl PublishRun {
    /// The relay's publish jobs/s over the raw loop's messages/s.
    pub fn ratio(&self) -> f64 {
        per(self.drain.jobs_per_second(), self.raw_per_second)
    }

    /// The relay's `noop` jobs/s over the raw loop's messages/s: the most
    /// the publish drain could reach with a free publish.
    pub fn noop_ratio(&self) -> f64 {
        per(self.noop.jobs_per_second(), self.raw_per_second)
    }

    /// The most a publish drain can reach on a machine where PostgreSQL,
    /// NATS and the relay share the cores: a publish job costs the raw
    /// loop's message plus its no-op twin, so its rate is at most
    /// 1 / (1/raw + 1/noop), both measured in this run.
    pub fn bound(&self) -> f64 {
        let (raw, noop) = (self.raw_per_second, self.noop.jobs_per_second());
        if raw > 0.0 && noop > 0.0 {
            1.0 / (1.0 / raw + 1.0 / noop)
        } else {
            0.0
        }
    }

    /// The publish drain over [`PublishRun::bound`].
    pub fn bound_ratio(&self) -> f64 {
        per(self.drain.jobs_per_second(), self.bound())
    }

    /// The most a publish drain can reach while it writes the two rows the
    /// contracts ask of each publish, with nothing else added to its no-op
    /// twin and a raw publish: 1 / (1/raw + 1/noop + 1/writes), all three
    /// measured in this run (see `publish_floor.rs`).
    pub fn bound_with_writes(&self) -> f64 {
        self.bound_adding(&[self.floor.both.jobs_per_second])
    }

    /// [`PublishRun::bound_with_writes`] with the attempt row alone: what a
    /// ledger kept elsewhere would leave.
    pub fn bound_with_attempts(&self) -> f64 {
        self.bound_adding(&[self.floor.attempt_only.jobs_per_second])
    }

    /// [`PublishRun::bound_with_writes`] with the relay's read of each
    /// job's order and event added: the floor with the contracts as they
    /// stand, where a body is rendered from the order when its job runs.
    pub fn bound_with_writes_and_read(&self) -> f64 {
        self.bound_adding(&[
            self.floor.both.jobs_per_second,
            self.floor.read.jobs_per_second,
        ])
    }

    /// [`PublishRun::bound_with_writes`] with each job's event row read by
    /// key: the floor were each body stored with its event.
    pub fn bound_with_writes_and_event(&self) -> f64 {
        self.bound_adding(&[
            self.floor.both.jobs_per_second,
            self.floor.event_only.jobs_per_second,
        ])
    }

    /// 1 / (1/raw + 1/noop + the sum of 1/each of `more`).
    fn bound_adding(&self, more: &[f64]) -> f64 {
        let (raw, noop) = (self.raw_per_second, self.noop.jobs_per_second());
        if raw > 0.0 && noop > 0.0 && more.iter().all(|rate| *rate > 0.0) {
            1.0 / (1.0 / raw + 1.0 / noop + more.iter().map(|rate| 1.0 / rate).sum::<f64>())
        } else {
            0.0
        }
    }

    /// The relay's CPU a no-op twin, µs.
    pub fn noop_cpu_micros_per_job(&self) -> Option<f64> {
        cpu_micros_per_job(&self.noop)
    }

    /// The least relay CPU a publish job can take: its no-op twin's and a
    /// raw publish's, through the same client library.
    pub fn cpu_floor_micros_per_job(&self) -> Option<f64> {
        self.noop_cpu_micros_per_job()
            .zip(self.raw_cpu_micros_per_message)
            .map(|(noop, raw)| noop + raw)
    }

    /// The relay process's CPU per publish job, in µs (`None` where the
    /// process's CPU time is not readable).
    pub fn cpu_micros_per_job(&self) -> Option<f64> {
        cpu_micros_per_job(&self.drain)
    }

    /// One line for the progress output.
    pub fn summary(&self) -> String {
        format!(
            "relay (NATS publishes): {:.0} jobs/s; same jobs as noop: {:.0} jobs/s; raw async-nats \
             loop ({} in flight, {} B bodies): {:.0} msgs/s; publish/raw {:.2}, noop/raw {:.2}, \
             publish/noop {:.2}; bound 1/(1/raw+1/noop) {:.0} jobs/s, publish/bound {:.2}; \
             relay CPU per publish job {}; transactions per job: publish {:.3}, noop {:.3}; \
             the attempt and ledger rows written again alone ({} jobs, {} a statement, \
             {} connections): \
             {:.0} jobs/s, server CPU {} a job; bound with them {:.0} jobs/s, {:.2} of the bound; \
             with the attempt row alone {:.2} of the bound; \
             the relay's read of the orders and events made again alone ({} pairs a \
             statement): {:.0} jobs/s, \
             server CPU {} a job; the events alone by key {:.0} jobs/s; \
             bound with the two rows and the read {:.2} of the bound, \
             with the two rows and the event by key {:.2}; \
             raw loop's own CPU {} a message; relay CPU floor (noop twin {} + raw) {}",
            self.drain.jobs_per_second(),
            self.noop.jobs_per_second(),
            self.raw_in_flight,
            self.body_bytes,
            self.raw_per_second,
            self.ratio(),
            self.noop_ratio(),
            per(self.drain.jobs_per_second(), self.noop.jobs_per_second()),
            self.bound(),
            self.bound_ratio(),
            micros(self.cpu_micros_per_job()),
            transactions_per_job(&self.drain),
            transactions_per_job(&self.noop),
            self.floor.jobs,
            self.floor.rows_per_statement,
            publish_floor::CONNECTIONS,
            self.floor.both.jobs_per_second,
            micros(self.floor.both.server_cpu_micros_per_job),
            self.bound_with_writes(),
            per(self.bound_with_writes(), self.bound()),
            per(self.bound_with_attempts(), self.bound()),
            MAX_PAIRS_PER_READ,
            self.floor.read.jobs_per_second,
            micros(self.floor.read.server_cpu_micros_per_job),
            self.floor.event_only.jobs_per_second,
            per(self.bound_with_writes_and_read(), self.bound()),
            per(self.bound_with_writes_and_event(), self.bound()),
            micros(self.raw_cpu_micros_per_message),
            micros(self.noop_cpu_micros_per_job()),
            micros(self.cpu_floor_micros_per_job()),
        )
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "jobs": self.drain.jobs,
            "batch": self.drain.batch,
            "in_flight": self.raw_in_flight,
            "body_bytes": self.body_bytes,
            "publish_jobs_per_s": self.drain.jobs_per_second(),
            "noop_jobs_per_s": self.noop.jobs_per_second(),
            "raw_msgs_per_s": self.raw_per_second,
            "publish_over_raw": self.ratio(),
            "noop_over_raw": self.noop_ratio(),
            "bound_jobs_per_s": self.bound(),
            "publish_over_bound": self.bound_ratio(),
            "publish_relay_cpu_us_per_job": self.cpu_micros_per_job(),
            "publish_transactions_per_job": transactions_per_job(&self.drain),
            "noop_transactions_per_job": transactions_per_job(&self.noop),
            "publish_relay_cpu_s": self.drain.cpu_seconds,
            "noop_relay_cpu_s": self.noop.cpu_seconds,
            "writes_alone_jobs": self.floor.jobs,
            "writes_alone_rows_per_statement": self.floor.rows_per_statement,
            "read_alone_pairs_per_statement": MAX_PAIRS_PER_READ,
            "writes_alone_jobs_per_s": self.floor.both.jobs_per_second,
            "writes_alone_server_cpu_us_per_job": self.floor.both.server_cpu_micros_per_job,
            "writes_alone_client_cpu_us_per_job": self.floor.both.client_cpu_micros_per_job,
            "attempts_alone_jobs_per_s": self.floor.attempt_only.jobs_per_second,
            "attempts_alone_server_cpu_us_per_job":
                self.floor.attempt_only.server_cpu_micros_per_job,
            "bound_with_writes_jobs_per_s": self.bound_with_writes(),
            "bound_with_writes_over_bound": per(self.bound_with_writes(), self.bound()),
            "bound_with_attempts_over_bound": per(self.bound_with_attempts(), self.bound()),
            "read_alone_jobs_per_s": self.floor.read.jobs_per_second,
            "read_alone_server_cpu_us_per_job": self.floor.read.server_cpu_micros_per_job,
            "event_alone_jobs_per_s": self.floor.event_only.jobs_per_second,
            "bound_with_writes_and_read_over_bound":
                per(self.bound_with_writes_and_read(), self.bound()),
            "bound_with_writes_and_event_over_bound":
                per(self.bound_with_writes_and_event(), self.bound()),
            "raw_cpu_us_per_msg": self.raw_cpu_micros_per_message,
            "noop_relay_cpu_us_per_job": self.noop_cpu_micros_per_job(),
            "relay_cpu_floor_us_per_job": self.cpu_floor_micros_per_job(),
        })
    }
}

fn cpu_micros_per_job(run: &DrainRun) -> Option<f64> {
    let jobs = run.jobs as f64;
    run.cpu_seconds
        .filter(|_| jobs > 0.0)
        .map(|cpu| cpu * 1e6 / jobs)
}

fn micros(us: Option<f64>) -> String {
    us.map_or_else(|| "unknown".to_owned(), |us| format!("{us:.1} µs"))
}

fn per(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

fn transactions_per_job(run: &DrainRun) -> f64 {
    run.server.transactions as f64 / run.jobs.max(1) as f64
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
            // The bench's server speaks plaintext: the endpoint's opt-in.
            "INSERT INTO endpoints (name, url, secret, stream, subject_prefix, allow_http) \
             VALUES ($1, $2, 'unused', $3, $4, true) \
             ON CONFLICT (name) DO UPDATE SET url = $2, stream = $3, subject_prefix = $4, \
               allow_http = true",
        )
        .bind::<diesel::sql_types::Text, _>(ENDPOINT)
        .bind::<diesel::sql_types::Text, _>(&nats_url)
        .bind::<diesel::sql_types::Text, _>(&stream_name)
        .bind::<diesel::sql_types::Text, _>(&prefix_name)
        .execute(&mut conn)?;
        anyhow::Ok(())
    })
    .await??;

    let noop = Workload {
        label: format!("{batch}, publish jobs as noop"),
        jobs: args.real_jobs,
        kinds: "noop".to_owned(),
        env: vec![],
        enqueue: enqueue_noop_twins,
        keys: None,
        pin: None,
        exe: None,
    };
    let publish = Workload {
        label: format!("{batch}, NATS publishes"),
        jobs: args.real_jobs,
        kinds: "order_publish".to_owned(),
        // The bench's server is on loopback.
        env: vec![("WEBHOOK_ALLOW_PRIVATE", "true".to_owned())],
        enqueue: enqueue_publishes,
        keys: None,
        pin: None,
        exe: None,
    };
    let (owned_url, concurrency) = (url.to_owned(), args.concurrency);
    let (noop, drain) = tokio::task::spawn_blocking(move || {
        let noop = drain::run(&owned_url, &noop, concurrency, batch);
        let drain = drain::run(&owned_url, &publish, concurrency, batch);
        // The later runs place orders through the API: left in place, the
        // endpoint would fan each out to a publish job nobody there claims.
        let mut conn = PgConnection::establish(&owned_url)?;
        diesel::sql_query("DELETE FROM endpoints WHERE name = $1")
            .bind::<diesel::sql_types::Text, _>(ENDPOINT)
            .execute(&mut conn)?;
        anyhow::Ok((noop?, drain?))
    })
    .await??;
    let mut info = js.get_stream(stream).await?;
    let stored = info.info().await?.state.messages;
    anyhow::ensure!(
        stored == drain.jobs as u64,
        "the stream holds {stored} messages for {} publish jobs",
        drain.jobs
    );
    // The raw loop sends what the relay sent: a stored message's body.
    let body = info
        .get_raw_message(1)
        .await
        .context("reading back the drain's first message")?
        .payload;

    let cpu_before = drain::process_cpu_seconds(None);
    let raw_per_second = raw_loop(js, stream, prefix, &body, drain.jobs, concurrency).await?;
    let raw_cpu_micros_per_message = cpu_before
        .zip(drain::process_cpu_seconds(None))
        .filter(|_| drain.jobs > 0)
        .map(|(before, after)| (after - before) * 1e6 / drain.jobs as f64);
    // As many rows a statement as the relay has slots: the most outcomes
    // one of its finishes can hold.
    let owned_url = url.to_owned();
    let floor = tokio::task::spawn_blocking(move || publish_floor::replay(&owned_url, concurrency))
        .await??;
    Ok(PublishRun {
        drain,
        noop,
        raw_per_second,
        raw_in_flight: concurrency,
        body_bytes: body.len(),
        raw_cpu_micros_per_message,
        floor,
    })
}

/// Publishes `n` messages like the relay's (its headers, `body`), each on a
/// subject of its own, `concurrency` awaiting their PubAck at once; messages
/// per second.
async fn raw_loop(
    js: &jetstream::Context,
    stream: &str,
    prefix: &str,
    body: &bytes::Bytes,
    n: usize,
    concurrency: usize,
) -> anyhow::Result<f64> {
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
                    publication.body.clone(),
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
    enqueue_order_jobs(conn, jobs, "order_publish")
}

/// [`enqueue_publishes`] with kind `noop`: the same rows for the relay to
/// claim, load nothing for and finish.
fn enqueue_noop_twins(
    conn: &mut PgConnection,
    jobs: usize,
) -> anyhow::Result<super::stats::EnqueueMarks> {
    enqueue_order_jobs(conn, jobs, "noop")
}

fn enqueue_order_jobs(
    conn: &mut PgConnection,
    jobs: usize,
    kind: &'static str,
) -> anyhow::Result<super::stats::EnqueueMarks> {
    let orders = i64::try_from(jobs).unwrap_or(i64::MAX);
    super::queue::enqueue_timed(
        conn,
        "jobs, order_items, order_events, orders, receipts",
        kind,
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
                 INSERT INTO jobs (order_id, kind, payload, ordering_key, has_dependents) \
                 SELECT ev.order_id, $2, \
                        jsonb_build_object('order_id', ev.order_id, 'event_id', ev.id, \
                                           'endpoint_id', e.id), \
                        'endpoint:' || e.id || ':order:' || ev.order_id, false \
                 FROM events ev, endpoints e WHERE e.name = 'bench-nats'",
            )
            .bind::<BigInt, _>(orders)
            .bind::<diesel::sql_types::Text, _>(kind)
            .execute(conn)
            .map(drop)
        },
    )
}
