//! Open-loop placement: orders sent to the API on a fixed schedule, each
//! request started at its slot whether or not the earlier ones were
//! answered, as a shop's customers arrive; beside it, a relay at the
//! defaults drains the jobs the orders enqueue. For each rate: the rate the
//! API achieved, the jobs' enqueue-to-start latency, and the queue's depth
//! over time.
//!
//! A closed loop (the saturation run) slows down with the server and so
//! never sees a queue build; an open loop keeps arriving.
//!
//! The generator runs on a runtime of its own, on its own thread: on the
//! bench's shared runtime the relay's and the API's tasks could hold it back,
//! and a late generator sends bursts the schedule never asked for. Each run
//! records how late its sends were (scheduled slot to actual send), and the
//! checkpoints and autovacuum passes over `jobs` during it, so that a run
//! with a bad p99 says which of them came with it. Each run starts after a
//! CHECKPOINT, so none inherits the write-back of the phases before it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use tokio::sync::Semaphore;

use super::BenchArgs;
use super::arrival::ArrivalRate;
use super::depth::{self, DepthProbe, DepthSample, DepthSummary};
use super::latency::RecordingRelay;
use super::orders::{self, ApiUnderTest};
use super::percentiles::Latency;
use super::phases::{self, Phases, WaitSampler};
use super::stats::{self, Background};
use order_service::worker_pool::PoolSettings;

/// A request sent this long after its slot counts as late: the generator
/// itself fell behind (a starved CPU), and the load was lighter than asked.
const LATE: Duration = Duration::from_millis(10);
/// Requests in flight at most; a slot that finds none free is counted as
/// refused. Far above what a rate the API sustains needs (rate x latency).
pub(super) const MAX_IN_FLIGHT: usize = 1024;
/// How long the requests still in flight when the schedule ends may take.
const ANSWER_GRACE: Duration = Duration::from_secs(5);
/// How long the relay may take to start the run's last jobs.
pub(super) const DRAIN_LIMIT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct OpenLoopRun {
    pub requested: ArrivalRate,
    pub target_per_second: f64,
    pub seconds: f64,
    pub sent: u64,
    /// `201`s received before the schedule ended.
    pub placed_in_time: u64,
    /// `201`s in all, the late answers included.
    pub placed: u64,
    /// Of [`OpenLoopRun::errors`]: slots at which no request was sent, [`MAX_IN_FLIGHT`]
    /// being in flight already (the generator's bound, not an answer).
    pub refused: u64,
    /// Of [`OpenLoopRun::errors`]: requests that got no HTTP answer (refused, reset).
    pub failed: u64,
    /// Of [`OpenLoopRun::errors`]: the answers other than `201`, by status, ascending.
    pub statuses: Vec<(u16, u64)>,
    /// Requests sent more than [`LATE`] after their slot.
    pub late_sends: u64,
    /// Requests with no answer within [`ANSWER_GRACE`] of the end.
    pub unanswered: u64,
    pub post_latency: Latency,
    /// Jobs the run's orders enqueued, and those the relay had not started
    /// within [`DRAIN_LIMIT`] of the end (their waits are missing from
    /// `enqueue_to_start`, which then reads low).
    pub jobs: i64,
    pub unstarted: i64,
    pub enqueue_to_start: Latency,
    pub depth: Vec<DepthSample>,
    pub depth_summary: Option<DepthSummary>,
    /// Which `--repeat` run of this rate (from 1).
    pub round: usize,
    /// How late each request was sent after its slot: the generator's own
    /// lag, not the system's (enqueue-to-start counts from `created_at`,
    /// which a late send moves too, so a lagging generator shows here).
    pub send_lateness: Latency,
    /// Checkpoints and autovacuum passes over `jobs` during the run.
    pub background: Background,
    /// Where the enqueue-to-start time went; `None` when no started job
    /// was found finished.
    pub phases: Option<Phases>,
}

impl OpenLoopRun {
    /// Slots with no request free, failed requests, and answers other than
    /// `201`.
    pub fn errors(&self) -> u64 {
        self.refused + self.failed + self.statuses.iter().map(|(_, n)| n).sum::<u64>()
    }

    pub fn achieved_per_second(&self) -> f64 {
        self.placed_in_time as f64 / self.seconds.max(f64::MIN_POSITIVE)
    }
    pub fn jobs_per_second(&self) -> f64 {
        self.jobs as f64 / self.seconds.max(f64::MIN_POSITIVE)
    }
}

/// Every `--arrival-rate` in turn. Shares resolve against `saturation`;
/// without it they are skipped, said on stderr.
pub async fn measure_all(
    url: &str,
    args: &BenchArgs,
    saturation: Option<f64>,
) -> anyhow::Result<Vec<OpenLoopRun>> {
    let mut runs = Vec::new();
    for &requested in &args.arrival_rate {
        let Some(target) = requested.resolve(saturation) else {
            eprintln!("  open loop at {requested} skipped: no saturation run (--api-clients 0)");
            continue;
        };
        for round in 1..=args.repeat {
            let run = measure(url, args, requested, target, round).await?;
            eprintln!(
                "  open loop at {requested} ({target:.0} orders/s), run {round} of {}: {:.0} orders/s placed, \
             enqueue-to-start p50 {:.2} ms p99 {:.2} ms, depth {}, sends late p99 {:.2} ms max {:.2} ms, \
             {} checkpoints, {} autovacuums of jobs",
                args.repeat,
                run.achieved_per_second(),
                run.enqueue_to_start.p50_ms,
                run.enqueue_to_start.p99_ms,
                match &run.depth_summary {
                    Some(d) if d.bounded => format!("bounded (max {})", d.max),
                    Some(d) => format!("growing {:.0} jobs/s (max {})", d.growth_per_second, d.max),
                    None => "-".to_owned(),
                },
                run.send_lateness.p99_ms,
                run.send_lateness.max_ms,
                run.background.checkpoints,
                run.background.jobs_autovacuums,
            );
            if let Some(phases) = &run.phases {
                eprintln!("    {}", phases.line());
            }
            runs.push(run);
        }
    }
    Ok(runs)
}

async fn measure(
    url: &str,
    args: &BenchArgs,
    requested: ArrivalRate,
    target: f64,
    round: usize,
) -> anyhow::Result<OpenLoopRun> {
    orders::truncate(url).await?;
    super::latency::reset(url).await?;
    // The relay as `outbox-relay relay` runs with no settings given (or at
    // `--concurrency` and `--batch`); its executor does nothing, so the
    // machinery alone is measured.
    let kinds = order_service::orders::ORDER_JOB_KINDS
        .map(str::to_owned)
        .to_vec();
    let relay = RecordingRelay::start_with(url, open_loop_settings(kinds, args), true).await?;
    // The API as the saturation run serves it: a pool for `--api-clients`
    // (without that run, the default 16).
    let api = ApiUnderTest::start(
        url,
        match args.api_clients {
            0 => 16,
            clients => clients,
        },
        MAX_IN_FLIGHT,
        Duration::from_secs(30),
        order_service::api::ApiAuth::Keys,
    )
    .await?;
    let endpoint = api.endpoint();
    let mut generator = Generator::spawn(
        endpoint,
        api.api_key.clone(),
        target,
        args.open_loop_duration,
    )?;
    // Warm-up (in the generator): connections, prepared plans, the pools;
    // its jobs drained and left out by their created_at.
    generator.warmed().await?;
    anyhow::ensure!(
        wait_until_drained(url, Duration::from_secs(10)).await?,
        "the relay did not drain the warm-up's jobs in 10 s"
    );

    checkpoint(url).await?;
    let background_before = background(url).await?;
    let window_start = chrono::Utc::now();
    let sampler = WaitSampler::start(url)?;
    let (started, finished) = generator.go().await?;
    let probe = DepthProbe::start(url, started);
    // The depth is sampled while the schedule runs, not through the answers'
    // grace after it.
    tokio::time::sleep_until((started + args.open_loop_duration).into()).await;
    let depth = probe.finish().await?;
    let server_waits = tokio::task::spawn_blocking(move || sampler.finish()).await??;
    let answers = finished
        .await
        .map_err(|_| anyhow::anyhow!("the load generator's thread ended early"))??;
    api.stop().await?;
    let background_after = background(url).await?;

    // Jobs left unstarted are counted below; their waits are not known.
    let drained = wait_until_drained(url, DRAIN_LIMIT).await;
    let starts = relay.starts_since(window_start);
    let mut waits: Vec<u64> = starts.iter().map(phases::Start::wait_micros).collect();
    waits.sort_unstable();
    relay.stop().await?;
    drained?;
    let phases = {
        let url = url.to_owned();
        let run = args.open_loop_duration;
        tokio::task::spawn_blocking(move || -> anyhow::Result<Option<Phases>> {
            let mut conn = PgConnection::establish(&url)?;
            phases::measure(&mut conn, &starts, server_waits, run)
        })
        .await??
    };
    let jobs = jobs_created_since(url, window_start).await?;
    let seconds = args.open_loop_duration.as_secs_f64();
    let started_jobs = i64::try_from(waits.len()).unwrap_or(i64::MAX);
    let job_rate = jobs as f64 / seconds;
    Ok(OpenLoopRun {
        requested,
        target_per_second: target,
        seconds,
        sent: answers.sent,
        placed_in_time: answers.placed_in_time,
        placed: answers.placed,
        refused: answers.refused,
        failed: answers.failed,
        statuses: answers.statuses,
        late_sends: answers.late_sends,
        unanswered: answers.unanswered,
        post_latency: answers.latency,
        jobs,
        unstarted: (jobs - started_jobs).max(0),
        enqueue_to_start: Latency::from_sorted_micros(&waits),
        depth_summary: depth::summarize(&depth, job_rate),
        depth,
        round,
        send_lateness: answers.lateness,
        background: background_after.since(background_before),
        phases,
    })
}

/// Writes back what the setup dirtied (the truncation, the warm-up, and the
/// bench's earlier rows) before the run is timed, as the growth row does
/// before its drain: else the checkpoint that debt starts lands in whichever
/// run reaches `max_wal_size` or `checkpoint_timeout`, and one run in five
/// pays for the phases before it. A checkpoint during the run is still
/// counted and reported with it. Not a superuser: the run goes ahead as
/// before.
async fn checkpoint(url: &str) -> anyhow::Result<()> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut conn = PgConnection::establish(&url)?;
        if let Err(error) = diesel::sql_query("CHECKPOINT").execute(&mut conn) {
            eprintln!("  open loop: no CHECKPOINT before the run ({error})");
        }
        Ok(())
    })
    .await?
}

/// The checkpoint and autovacuum counters now.
async fn background(url: &str) -> anyhow::Result<Background> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<Background> {
        let mut conn = PgConnection::establish(&url)?;
        Ok(stats::background(&mut conn)?)
    })
    .await?
}

/// The load generator on a thread and a single-threaded runtime of its own,
/// with its own HTTP client (a client's connections belong to the runtime
/// that opened them).
struct Generator {
    warmed: tokio::sync::oneshot::Receiver<anyhow::Result<()>>,
    go: tokio::sync::oneshot::Sender<()>,
    started: tokio::sync::oneshot::Receiver<Instant>,
    answers: tokio::sync::oneshot::Receiver<anyhow::Result<Answers>>,
}

impl Generator {
    fn spawn(
        endpoint: String,
        api_key: Option<String>,
        rate: f64,
        duration: Duration,
    ) -> anyhow::Result<Generator> {
        let (warmed_tx, warmed) = tokio::sync::oneshot::channel();
        let (go, go_rx) = tokio::sync::oneshot::channel::<()>();
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let (answers_tx, answers) = tokio::sync::oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("bench-open-loop-generator".to_owned())
            .spawn(move || {
                runtime.block_on(async move {
                    let client = match orders::load_client(64, api_key.as_deref()) {
                        Ok(client) => client,
                        Err(error) => {
                            let _ = warmed_tx.send(Err(error));
                            return;
                        }
                    };
                    orders::load(&client, &endpoint, 4, Duration::from_millis(300)).await;
                    let _ = warmed_tx.send(Ok(()));
                    if go_rx.await.is_err() {
                        return;
                    }
                    let started = Instant::now();
                    let _ = started_tx.send(started);
                    let schedule = Schedule::run(&client, &endpoint, rate, duration, started).await;
                    let answers = schedule.answers(started + duration).await;
                    let _ = answers_tx.send(Ok(answers));
                });
            })?;
        Ok(Generator {
            warmed,
            go,
            started,
            answers,
        })
    }

    /// Once the warm-up's requests were answered.
    async fn warmed(&mut self) -> anyhow::Result<()> {
        (&mut self.warmed)
            .await
            .map_err(|_| anyhow::anyhow!("the load generator's thread ended early"))?
    }

    /// Starts the schedule; its start instant, and its answers to come.
    async fn go(
        self,
    ) -> anyhow::Result<(
        Instant,
        tokio::sync::oneshot::Receiver<anyhow::Result<Answers>>,
    )> {
        self.go
            .send(())
            .map_err(|()| anyhow::anyhow!("the load generator's thread ended early"))?;
        let started = self
            .started
            .await
            .map_err(|_| anyhow::anyhow!("the load generator's thread ended early"))?;
        Ok((started, self.answers))
    }
}

/// The requests of one run, sent on schedule.
struct Schedule {
    tasks: tokio::task::JoinSet<Answer>,
    answered: Vec<Answer>,
    sent: u64,
    refused: u64,
    late_sends: u64,
    /// Microseconds from each slot to its send.
    lateness: Vec<u64>,
}

/// How one request ended, and when.
struct Answer {
    /// The answer's status; `None` for a request that got none.
    status: Option<u16>,
    at: Instant,
    micros: u64,
}

/// What the requests of a run came to.
struct Answers {
    sent: u64,
    placed_in_time: u64,
    placed: u64,
    refused: u64,
    failed: u64,
    statuses: Vec<(u16, u64)>,
    late_sends: u64,
    unanswered: u64,
    latency: Latency,
    lateness: Latency,
}

impl Schedule {
    /// Sends `rate` orders a second for `duration` from `started`: request
    /// `i` at `started + i / rate`, each on a task of its own.
    async fn run(
        client: &reqwest::Client,
        endpoint: &str,
        rate: f64,
        duration: Duration,
        started: Instant,
    ) -> Schedule {
        let total = (rate * duration.as_secs_f64()).round() as u64;
        let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        let mut schedule = Schedule {
            tasks: tokio::task::JoinSet::new(),
            answered: Vec::new(),
            sent: 0,
            refused: 0,
            late_sends: 0,
            lateness: Vec::with_capacity(usize::try_from(total).unwrap_or(0)),
        };
        for i in 0..total {
            let slot = started + Duration::from_secs_f64(i as f64 / rate);
            // Timers tick in milliseconds: above 1,000 a second, slots come
            // due in small bursts, each still sent at once.
            if slot > Instant::now() {
                tokio::time::sleep_until(slot.into()).await;
            }
            let late = Instant::now().saturating_duration_since(slot);
            if late > LATE {
                schedule.late_sends += 1;
            }
            schedule
                .lateness
                .push(u64::try_from(late.as_micros()).unwrap_or(u64::MAX));
            while let Some(done) = schedule.tasks.try_join_next() {
                schedule.answered.extend(done.ok());
            }
            let Ok(permit) = Arc::clone(&in_flight).try_acquire_owned() else {
                schedule.refused += 1;
                continue;
            };
            schedule.sent += 1;
            let request = orders::order_request(client, endpoint);
            schedule.tasks.spawn(async move {
                let sent_at = Instant::now();
                let status = request.send().await.ok().map(|r| r.status().as_u16());
                drop(permit);
                Answer {
                    status,
                    at: Instant::now(),
                    micros: u64::try_from(sent_at.elapsed().as_micros()).unwrap_or(u64::MAX),
                }
            });
        }
        schedule
    }

    /// Waits up to [`ANSWER_GRACE`] for the requests still in flight, and
    /// counts the answers against the schedule's `end`.
    async fn answers(mut self, end: Instant) -> Answers {
        let _ = tokio::time::timeout(ANSWER_GRACE, async {
            while let Some(done) = self.tasks.join_next().await {
                self.answered.extend(done.ok());
            }
        })
        .await;
        let unanswered = self.tasks.len() as u64;
        self.tasks.abort_all();
        let placed: Vec<&Answer> = self
            .answered
            .iter()
            .filter(|a| a.status == Some(201))
            .collect();
        let mut statuses = std::collections::BTreeMap::<u16, u64>::new();
        for status in self.answered.iter().filter_map(|a| a.status) {
            if status != 201 {
                *statuses.entry(status).or_default() += 1;
            }
        }
        let mut micros: Vec<u64> = placed.iter().map(|a| a.micros).collect();
        micros.sort_unstable();
        let placed_count = placed.len() as u64;
        let mut lateness = std::mem::take(&mut self.lateness);
        lateness.sort_unstable();
        Answers {
            sent: self.sent,
            placed_in_time: placed.iter().filter(|a| a.at <= end).count() as u64,
            placed: placed_count,
            refused: self.refused,
            failed: self.answered.iter().filter(|a| a.status.is_none()).count() as u64,
            statuses: statuses.into_iter().collect(),
            late_sends: self.late_sends,
            unanswered,
            latency: Latency::from_sorted_micros(&micros),
            lateness: Latency::from_sorted_micros(&lateness),
        }
    }
}

/// Waits until no job is pending or processing, for at most `limit`; false
/// if some still are then.
async fn wait_until_drained(url: &str, limit: Duration) -> anyhow::Result<bool> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<bool> {
        let mut conn = PgConnection::establish(&url)?;
        let deadline = Instant::now() + limit;
        while !super::queue::drained(&mut conn)? {
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(true)
    })
    .await?
}

/// Jobs created since `from`, wherever they are now.
async fn jobs_created_since(url: &str, from: chrono::DateTime<chrono::Utc>) -> anyhow::Result<i64> {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<i64> {
        let mut conn = PgConnection::establish(&url)?;
        let count: Count =
            diesel::sql_query("SELECT count(*) AS n FROM jobs_all WHERE created_at >= $1")
                .bind::<diesel::sql_types::Timestamptz, _>(from)
                .get_result(&mut conn)?;
        Ok(count.n)
    })
    .await?
}

/// The relay under an open-loop load: the defaults, unless `--concurrency` or
/// `--batch` say otherwise (their defaults are the relay's).
fn open_loop_settings(kinds: Vec<String>, args: &BenchArgs) -> PoolSettings {
    let mut settings = PoolSettings::new("bench-open-loop", kinds);
    settings.concurrency = args.concurrency;
    settings.batch_size = args.batch;
    settings
}
