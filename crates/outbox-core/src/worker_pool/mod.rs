//! The worker pool: a tokio worker pool that claims jobs and performs their effects.
//!
//! Split by role, as River does, one private module each (`src/worker_pool/`):
//! - `producer`: claims due jobs, never more than there are free slots, and
//!   wakes on NOTIFY (`listener`) or the poll interval;
//! - `runner`: runs one job's effect and turns its result into an outcome
//!   (`backoff::decide`, a pure function of the result and the attempt);
//! - `completer`: writes outcomes in fenced batches;
//! - `heartbeat`: extends the leases of everything in flight, one UPDATE for all;
//! - `reaper`: puts jobs whose lease expired (a dead worker's) back in the queue;
//! - `periodic`: enqueues the declared periodic jobs at their slots;
//! - `in_flight`: the claims held, each owned by one guard from claim to outcome;
//! - `health`: whether the loops still make progress (`/livez`), read through
//!   [`Liveness`];
//! - `settings`: [`PoolSettings`], their defaults and their checks.
//!
//! Shutdown is a [`CancellationToken`] passed down and `select!`ed on.

mod backoff;
mod claim_pace;
mod completer;
mod connection;
mod executor;
mod health;
mod heartbeat;
mod in_flight;
mod kind_metrics;
pub(crate) mod listener;
mod periodic;
mod producer;
mod reaper;
mod settings;
mod timeouts;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

pub use backoff::BackoffPolicy;
pub use health::Liveness;
pub use settings::{
    DEFAULT_BATCH_SIZE, DEFAULT_CONCURRENCY, DEFAULT_LEASE, InvalidSettings, MIN_LEASE,
    PoolSettings,
};
pub use timeouts::JobTimeouts;

pub(crate) use listener::open as open_connection;

use crate::db::PgPool;
/// What [`WorkerPool::new`] runs jobs with: reachable here, beside the worker pool,
/// for applications that write their own instead of using
/// [`Workers`](crate::worker::Workers).
pub use crate::worker::{BoxFuture, JobHandler};

/// Most outcomes written by one completer statement.
const MAX_COMPLETION_BATCH: usize = 512;
/// Most expired leases one reaper transaction handles.
const REAP_BATCH: i64 = 500;

/// Counters a worker pool keeps for itself (tests and `bench` read them; Prometheus
/// gets the same numbers through the `metrics` facade).
///
/// Each counts from the worker pool's start and only grows. They are updated with
/// relaxed atomics by the worker pool's tasks as they go: read them with
/// [`PoolStats::get`], and expect a snapshot of several counters to be
/// consistent only once the worker pool has stopped.
#[derive(Debug, Default)]
pub struct PoolStats {
    /// Jobs claimed (each claim of a job once, a re-claim again).
    pub claimed: AtomicU64,
    /// Outcomes `done` written.
    pub done: AtomicU64,
    /// Retries written: jobs sent back to `pending` with a backoff.
    pub retried: AtomicU64,
    /// Outcomes `failed` written (permanent errors, last attempts).
    pub failed: AtomicU64,
    /// Attempts whose claim this worker pool lost: the lease expired and a reaper
    /// took the job back (it may since have been re-claimed or cancelled).
    /// Noticed by the heartbeat while the effect ran (the effect is then
    /// cancelled) or when the outcome's fenced write matched nothing; either
    /// way the outcome was discarded.
    pub lease_lost: AtomicU64,
    /// Effects cancelled at their deadline (`RELAY_JOB_TIMEOUT`).
    pub timed_out: AtomicU64,
    /// Outcomes whose write failed inside a batch and were written alone, as
    /// a failure when even that failed (see the completer).
    pub isolated: AtomicU64,
    /// Jobs claimed but never started, handed back to `pending` at shutdown
    /// without spending an attempt.
    pub handed_back: AtomicU64,
    /// Jobs this worker pool's reaper took from expired leases (any worker pool's),
    /// requeued or failed.
    pub reaped: AtomicU64,
    /// Claim statements that returned at least one job.
    pub claims: AtomicU64,
    /// Statements that wrote outcomes (each holds one or more jobs).
    pub outcome_writes: AtomicU64,
}

impl PoolStats {
    /// The current value of one of these counters
    /// (`PoolStats::get(&stats.done)`).
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// State the worker pool's tasks share.
struct Shared {
    pool: PgPool,
    /// The worker pool's own connections for its hot statements.
    hot: connection::HotPath,
    settings: PoolSettings,
    executor: Arc<dyn JobHandler>,
    /// Claims whose outcome is not yet written. The heartbeat extends exactly
    /// these leases; each entry is owned by its [`in_flight::Claim`] guard.
    in_flight: Arc<in_flight::Registry>,
    /// One permit per effect slot; held from claim until the effect returns.
    slots: Arc<Semaphore>,
    /// How long effects take, on average: claims grow ahead of the slots
    /// only while effects are no slower than claims.
    effect_time: claim_pace::MovingAverage,
    /// Woken by the listener; the producer waits on it when the queue is empty.
    wake: Arc<Notify>,
    /// The earliest moment a job this worker pool scheduled (a retry, a reaped job)
    /// is due again; the producer wakes then instead of at the next poll.
    wake_at: Mutex<Option<Instant>>,
    /// Told when `wake_at` moves earlier, so a producer already asleep
    /// recomputes how long to sleep.
    rescheduled: Notify,
    /// Poked by the reaper to have the heartbeat renew leases at once.
    beat_now: Notify,
    /// False after a heartbeat failed, until one succeeds: the reaper waits for
    /// this worker pool's own leases to be renewed before it reaps anyone's.
    heartbeat_ok: std::sync::atomic::AtomicBool,
    liveness: Liveness,
    stats: Arc<PoolStats>,
    /// Each kind's metric handles, looked up on its first job.
    kinds: kind_metrics::KindMetricsCache,
    /// Wakes the worker pools of other kinds, after commit, for the
    /// dependents this worker pool's finishes release (its own kinds it
    /// claims at once, through `wake`).
    waker: crate::outbox::Waker,
}

impl Shared {
    /// Wakes the producer at `at` (or earlier, if something else is due first).
    fn wake_at(&self, at: Instant) {
        let mut next = self.wake_at.lock().unwrap_or_else(|e| e.into_inner());
        if next.is_none_or(|current| at < current) {
            *next = Some(at);
            self.rescheduled.notify_one();
        }
    }

    /// The scheduled wake-up, cleared once it has passed.
    fn next_wake(&self) -> Option<Instant> {
        let mut next = self.wake_at.lock().unwrap_or_else(|e| e.into_inner());
        if next.is_some_and(|at| at <= Instant::now()) {
            *next = None;
            return Some(Instant::now());
        }
        *next
    }
}

/// A worker pool, ready to run. See the module docs for its parts.
///
/// Any number of worker pools, in one process or many, may run against the same
/// database: claims skip each other's rows and every write is fenced by the
/// claim's token. Build with [`WorkerPool::new`], then run it once with
/// [`WorkerPool::run_until_stopped`].
pub struct WorkerPool {
    shared: Arc<Shared>,
    database_url: String,
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPool")
            .field("settings", &self.shared.settings)
            .finish_non_exhaustive()
    }
}

impl WorkerPool {
    /// A worker pool that claims with `pool` and performs jobs with `executor`
    /// (usually a [`Workers`](crate::worker::Workers) registry). `database_url`
    /// is for the dedicated LISTEN connection, which the pool cannot provide;
    /// its TLS settings are honoured as libpq reads them. Starts nothing and
    /// connects to nothing: [`WorkerPool::run_until_stopped`] does. Fails when
    /// `settings` are invalid (an empty worker id or kind list, a zero
    /// concurrency, batch size, period or timeout, a lease under 100 ms).
    pub fn new(
        pool: PgPool,
        database_url: impl Into<String>,
        settings: PoolSettings,
        executor: Arc<dyn JobHandler>,
    ) -> Result<WorkerPool, InvalidSettings> {
        settings.validate()?;
        let slots = Arc::new(Semaphore::new(settings.concurrency));
        let database_url = database_url.into();
        let hot = connection::HotPath::new(
            pool.clone(),
            database_url.clone(),
            &settings,
            settings.writers(),
        );
        Ok(WorkerPool {
            shared: Arc::new(Shared {
                hot,
                pool,
                liveness: Liveness::new(settings.effective_stall_timeout(), Arc::clone(&slots)),
                slots,
                settings,
                executor,
                in_flight: Arc::default(),
                effect_time: claim_pace::MovingAverage::default(),
                wake: Arc::new(Notify::new()),
                wake_at: Mutex::new(None),
                rescheduled: Notify::new(),
                beat_now: Notify::new(),
                heartbeat_ok: std::sync::atomic::AtomicBool::new(true),
                stats: Arc::new(PoolStats::default()),
                kinds: kind_metrics::KindMetricsCache::default(),
                waker: crate::outbox::Waker::new(),
            }),
            database_url,
        })
    }

    /// The worker pool's counters; the handle stays readable after the worker pool stops.
    pub fn stats(&self) -> Arc<PoolStats> {
        Arc::clone(&self.shared.stats)
    }

    /// Whether this worker pool still makes progress; serve it as `/livez`.
    pub fn liveness(&self) -> Liveness {
        self.shared.liveness.clone()
    }

    /// Runs until `shutdown` is cancelled, then stops claiming, gives in-flight
    /// effects `shutdown_grace` to finish, interrupts the rest (their jobs go back
    /// to `pending`, the attempt counted), writes every outcome, and returns.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) {
        let shared = self.shared;
        let settings = &shared.settings;
        tracing::info!(
            worker_id = %settings.worker_id,
            kinds = ?settings.kinds,
            concurrency = settings.concurrency,
            batch_size = settings.batch_size,
            lease = ?settings.lease,
            "relay started"
        );

        // Background tasks outlive the producer: in-flight jobs still need
        // heartbeats while they finish, and their outcomes still need writing.
        let background = CancellationToken::new();
        let mut tasks = tokio::task::JoinSet::new();
        if settings.listen {
            tasks.spawn(listener::listen_for_jobs(
                self.database_url.clone(),
                settings.kinds.clone(),
                Arc::clone(&shared.wake),
                background.clone(),
            ));
        }
        tasks.spawn(
            shared
                .waker
                .clone()
                .run(shared.pool.clone(), background.clone()),
        );
        tasks.spawn(heartbeat::run(Arc::clone(&shared), background.clone()));
        tasks.spawn(reaper::run(Arc::clone(&shared), background.clone()));
        if !settings.periodic_jobs.is_empty() {
            // Stopped with the producer: a worker pool shutting down enqueues no
            // more slots, and the next worker pool up runs a missed one.
            tasks.spawn(periodic::run(Arc::clone(&shared), shutdown.clone()));
        }

        // Room for two outcomes of every job the worker pool may hold (running or
        // claimed ahead): a runner that finds the channel full keeps its slot
        // until the writer catches up (sized for the slots alone, it held the
        // defaults back: docs/performance.md, "Room ahead for every claim
        // under way").
        let held = settings.concurrency
            + claim_pace::ClaimSize::ahead_room(settings.batch_size, settings.concurrency);
        let (completions, completed) = mpsc::channel(held * 2 + 64);
        let completer_stop = CancellationToken::new();
        let completer = tokio::spawn(completer::run_all(
            Arc::clone(&shared),
            completed,
            completer_stop.clone(),
            shared.settings.writers(),
        ));

        let interrupt = CancellationToken::new();
        // A task of its own, not awaited in place: whoever calls this method
        // may poll it from outside the runtime's workers (a `block_on` on the
        // main thread, as the CLI does), and every slot a finished effect
        // gives back wakes the producer, each wake then a futex call into
        // that thread: 9% of the relay's CPU in a 1024 / 256 drain
        // (docs/performance.md, "The producer on the runtime's workers").
        let producing = tokio::spawn(producer::run(
            Arc::clone(&shared),
            completions,
            shutdown,
            interrupt.clone(),
        ));
        if let Err(error) = producing.await {
            tracing::error!(error = %error, "the producer stopped abnormally; draining what it started");
        }

        // Every permit back means every effect has returned and handed its
        // outcome to the completer.
        let all = u32::try_from(settings.concurrency).unwrap_or(u32::MAX);
        let drained =
            tokio::time::timeout(settings.shutdown_grace, shared.slots.acquire_many(all)).await;
        if drained.is_err() {
            let running = settings.concurrency - shared.slots.available_permits();
            tracing::warn!(
                running,
                grace = ?settings.shutdown_grace,
                "shutdown grace elapsed; interrupting the remaining effects"
            );
            interrupt.cancel();
            let _ = shared.slots.acquire_many(all).await;
        }

        // The completer exits once every sender is gone and the channel is empty.
        // If the database is down it keeps retrying; give it a bounded while.
        let mut completer = completer;
        if tokio::time::timeout(
            settings.shutdown_grace.max(Duration::from_secs(5)),
            &mut completer,
        )
        .await
        .is_err()
        {
            tracing::error!(
                unwritten = shared.in_flight.len(),
                "could not write all outcomes before exiting; their leases will expire and the reaper will requeue them"
            );
            completer_stop.cancel();
            let _ = completer.await;
        }

        background.cancel();
        while tasks.join_next().await.is_some() {}
        shared.liveness.stopped();
        let stats = &shared.stats;
        tracing::info!(
            worker_id = %settings.worker_id,
            claimed = PoolStats::get(&stats.claimed),
            claims = PoolStats::get(&stats.claims),
            done = PoolStats::get(&stats.done),
            retried = PoolStats::get(&stats.retried),
            failed = PoolStats::get(&stats.failed),
            outcome_writes = PoolStats::get(&stats.outcome_writes),
            lease_lost = PoolStats::get(&stats.lease_lost),
            timed_out = PoolStats::get(&stats.timed_out),
            isolated = PoolStats::get(&stats.isolated),
            handed_back = PoolStats::get(&stats.handed_back),
            reaped = PoolStats::get(&stats.reaped),
            "relay stopped"
        );
    }
}
