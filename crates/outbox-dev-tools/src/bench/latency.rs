//! Enqueue-to-start latency: jobs enqueued one at a time, each in its own
//! transaction, against an idle relay and again while the API takes orders;
//! measured from just before the enqueue's transaction begins to the effect
//! starting, both on this process's monotonic clock, as the peer harness
//! measures its queues (the enqueue call to the handler's start). From the
//! commit's return instead, a relay woken by the commit often started the
//! job before the enqueuing thread had read the clock again on a loaded
//! machine, and the wait came out as zero.
//!
//! The open-loop runs use the same recording relay for the orders' own jobs,
//! measured from each job's `created_at` (the enqueuing transaction's start,
//! by the database's clock) to its start by this process's wall clock: the
//! API commits them, so no commit instant of ours exists.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use tokio_util::sync::CancellationToken;

use super::BenchArgs;
use super::percentiles::Latency;
use super::phases::Start;
use order_service::effects::Noop;
use order_service::effects::{BoxFuture, EffectResult, JobContext, JobHandler};
use order_service::outbox::{Enqueuer, JobOptions};
use order_service::worker_pool::{PoolSettings, WorkerPool};
use outbox_core::statements::ClaimedJob;

/// Notes when each job's effect started. Every job succeeds at once, doing
/// nothing: the relay's machinery is what is measured.
struct StartRecorder {
    starts: Arc<Mutex<HashMap<i64, Instant>>>,
    /// The other jobs' starts, when asked for (open loop).
    waits: Option<Arc<Mutex<Vec<Start>>>>,
}

impl JobHandler for StartRecorder {
    fn execute<'a>(&'a self, job: &'a ClaimedJob, _ctx: JobContext) -> BoxFuture<'a, EffectResult> {
        if job.kind == "noop" {
            let now = Instant::now();
            self.starts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(job.id, now);
        } else if let Some(waits) = &self.waits {
            waits.lock().unwrap_or_else(|e| e.into_inner()).push(Start {
                id: job.id,
                kind: order_service::orders::ORDER_JOB_KINDS
                    .into_iter()
                    .find(|k| *k == job.kind)
                    .unwrap_or("other"),
                created_at: job.created_at,
                started_at: chrono::Utc::now(),
            });
        }
        // The loaded run's order jobs succeed unrecorded: only its samples
        // are measured.
        Box::pin(std::future::ready(Ok(None)))
    }
}

/// Enqueue-to-start latency while the order API takes orders.
#[derive(Debug, Clone)]
pub struct LoadedLatency {
    pub clients: usize,
    pub orders_per_second: f64,
    pub errors: u64,
    pub latency: Latency,
}

/// Against an idle relay: nothing else runs.
pub async fn measure(url: &str, args: &BenchArgs) -> anyhow::Result<Latency> {
    reset(url).await?;
    let relay = RecordingRelay::start(url, vec!["noop".to_owned()], args).await?;
    let began = take_samples(url, args).await?;
    relay.latency_of(&began).await
}

/// With `args.api_clients` clients placing orders through the API the whole
/// time, as in the placement run. The relay also performs the orders' jobs
/// (as noops, which it starts like any other), so the samples queue behind
/// real claim traffic, not only behind a busy database.
pub async fn measure_loaded(url: &str, args: &BenchArgs) -> anyhow::Result<LoadedLatency> {
    super::orders::truncate(url).await?;
    reset(url).await?;
    let kinds = std::iter::once("noop")
        .chain(order_service::orders::ORDER_JOB_KINDS)
        .map(str::to_owned)
        .collect();
    let relay = RecordingRelay::start(url, kinds, args).await?;
    let clients = args.api_clients;
    let api = super::orders::ApiUnderTest::start(
        url,
        clients,
        0,
        Duration::from_secs(30),
        order_service::api::ApiAuth::Keys,
    )
    .await?;
    let stop_load = CancellationToken::new();
    let load = tokio::spawn(super::orders::load_until(
        super::orders::load_client(clients, api.api_key.as_deref())?,
        api.endpoint(),
        clients,
        stop_load.clone(),
    ));
    // Warm-up: connections, prepared plans, the pool; the relay at its pace.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let began = take_samples(url, args).await;
    stop_load.cancel();
    let load = load.await?;
    api.stop().await?;
    let latency = relay.latency_of(&began?).await?;
    Ok(LoadedLatency {
        clients,
        orders_per_second: load.rate(),
        errors: load.errors,
        latency,
    })
}

/// An empty jobs table (and no claims), with today's jobs_done partitions.
pub(super) async fn reset(url: &str) -> anyhow::Result<()> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut conn = PgConnection::establish(&url)?;
        diesel::sql_query("TRUNCATE jobs, jobs_done, job_claims").execute(&mut conn)?;
        outbox_core::statements::ensure_done_partitions(&mut conn)?;
        Ok(())
    })
    .await?
}

/// A relay in this process whose executor notes when each `noop` job starts
/// (and, when asked, how long every other job waited).
pub(super) struct RecordingRelay {
    starts: Arc<Mutex<HashMap<i64, Instant>>>,
    waits: Option<Arc<Mutex<Vec<Start>>>>,
    stop: CancellationToken,
    running: tokio::task::JoinHandle<()>,
}

impl RecordingRelay {
    pub(super) async fn start(
        url: &str,
        kinds: Vec<String>,
        args: &BenchArgs,
    ) -> anyhow::Result<RecordingRelay> {
        let mut settings = PoolSettings::new("bench-latency", kinds);
        // The relay under test: the drain's settings (`--concurrency`, `--batch`).
        settings.concurrency = args.concurrency;
        settings.batch_size = args.batch;
        RecordingRelay::start_with(url, settings, false).await
    }

    /// A relay with `settings`, idle once this returns; with `record_waits`,
    /// it notes every other job's start (see [`Self::starts_since`]).
    pub(super) async fn start_with(
        url: &str,
        settings: PoolSettings,
        record_waits: bool,
    ) -> anyhow::Result<RecordingRelay> {
        let starts: Arc<Mutex<HashMap<i64, Instant>>> = Arc::default();
        let waits = record_waits.then(Arc::default);
        // As `outbox-relay relay` sizes it: a connection per effect slot,
        // plus the producer, the completer, the heartbeat and the reaper.
        let pool = order_service::db::build_pool(
            url,
            &order_service::db::PoolOptions {
                size: u32::try_from(settings.concurrency.min(64) + 4).unwrap_or(20),
                ..order_service::db::PoolOptions::default()
            },
        );
        let relay = WorkerPool::new(
            pool,
            url,
            settings,
            Arc::new(StartRecorder {
                starts: Arc::clone(&starts),
                waits: waits.clone(),
            }),
        )?;
        let server = url.to_owned();
        let (mut conn, since) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            let mut conn = PgConnection::establish(&server)?;
            let since = super::listening::server_clock(&mut conn)?;
            Ok((conn, since))
        })
        .await??;
        let stop = CancellationToken::new();
        let running = tokio::spawn(relay.run_until_stopped(stop.clone()));
        // Idle: listener connected, first empty claim done.
        tokio::task::spawn_blocking(move || super::listening::wait_for_listener(&mut conn, &since))
            .await??;
        Ok(RecordingRelay {
            starts,
            waits,
            stop,
            running,
        })
    }

    /// The starts noted so far of the jobs created since `from` (empty
    /// unless started with `record_waits`).
    pub(super) fn starts_since(&self, from: chrono::DateTime<chrono::Utc>) -> Vec<Start> {
        let Some(waits) = &self.waits else {
            return Vec::new();
        };
        let waits = waits.lock().unwrap_or_else(|e| e.into_inner());
        waits
            .iter()
            .filter(|w| w.created_at >= from)
            .copied()
            .collect()
    }

    /// Stops the relay and waits for it to have stopped.
    pub(super) async fn stop(self) -> anyhow::Result<()> {
        self.stop.cancel();
        self.running.await?;
        Ok(())
    }

    /// Waits for every sample to start, stops the relay, and returns the
    /// latencies from each enqueue's start to the job's.
    pub(super) async fn latency_of(self, began: &[(i64, Instant)]) -> anyhow::Result<Latency> {
        let wanted: std::collections::HashSet<i64> = began.iter().map(|(id, _)| *id).collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let seen = {
                let starts = self.starts.lock().unwrap_or_else(|e| e.into_inner());
                wanted.iter().filter(|id| starts.contains_key(id)).count()
            };
            if seen >= wanted.len() {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "only {seen} of {} latency samples started",
                wanted.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.stop.cancel();
        self.running.await?;

        let starts = self.starts.lock().unwrap_or_else(|e| e.into_inner());
        let mut micros: Vec<u64> = began
            .iter()
            .filter_map(|(id, at)| starts.get(id).map(|s| s.saturating_duration_since(*at)))
            .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
            .collect();
        micros.sort_unstable();
        Ok(Latency::from_sorted_micros(&micros))
    }
}

/// Enqueues `args.latency_samples` noop jobs, one per transaction, each
/// `args.latency_interval` after the last; returns each id with the moment
/// just before its transaction began.
pub(super) async fn take_samples(
    url: &str,
    args: &BenchArgs,
) -> anyhow::Result<Vec<(i64, Instant)>> {
    let samples = args.latency_samples;
    let interval = args.latency_interval;
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<(i64, Instant)>> {
        let mut conn = PgConnection::establish(&url)?;
        let progress = indicatif::ProgressBar::new(samples as u64);
        let mut began_at = Vec::with_capacity(samples);
        let enqueuer = Enqueuer::new();
        for i in 0..samples {
            let began = Instant::now();
            let id = conn.transaction(|conn| {
                enqueuer.enqueue(
                    conn,
                    &Noop(serde_json::json!({ "sample": i })),
                    &JobOptions::default(),
                )
            })?;
            began_at.push((id, began));
            progress.inc(1);
            std::thread::sleep(interval);
        }
        progress.finish_and_clear();
        Ok(began_at)
    })
    .await?
}
