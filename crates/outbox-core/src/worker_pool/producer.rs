//! The producer: claims due jobs into free slots and starts their effects.

use crate::lock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::FutureExt as _;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_util::sync::CancellationToken;

use super::claim_pace::{
    ClaimSize, Cursor, InFlightTarget, MovingAverage, effects_fast, most_claims,
};
use super::completer::Completion;
use super::in_flight::Claim;
use super::kind_metrics::KindMetrics;
use super::{PoolStats, Shared, executor};
use crate::db::Failure;
use crate::statements::{ClaimPosition, ClaimedJob, JobLease};

/// Claims and starts jobs until `shutdown`.
///
/// Every claim holds one slot permit per job it asks for, so a job is never
/// claimed without a slot to run it in. Claims run as tasks of their own, at
/// most `concurrency / batch_size` (rounded up) at a time, each taking every
/// free slot up to a batch: that lets a worker pool at batch 1 keep up with the same
/// number of plain claim loops, and keeps a worker pool at a large batch from
/// splitting its free slots into many small claims as effects finish one by one
/// (without the bound, 50,000 `noop` jobs at concurrency 16 and batch 16 took
/// 21,673 claims, 2.3 jobs each; with it, about 3,300).
///
/// How many of those run at once adapts to the queue ([`InFlightTarget`]):
/// one while claims come back short, one more after each full claim. A
/// shallow queue is then claimed by one statement at a time, not by several
/// that skip each other's rows and come back with a job or two each, while a
/// backlog gets every claim the slots allow. How many jobs each claim asks
/// for adapts too ([`ClaimSize`]): the batch size while the queue is shallow
/// or effects hold the slots; growing, on a deep queue of fast effects, to
/// claims that take jobs ahead of the slots, each holding an `ahead` permit
/// until a slot frees. Once a claim comes back short,
/// the queue is empty for us: no new claim starts until a NOTIFY, the poll
/// interval, or a reaped job wakes the producer.
pub(super) async fn run(
    shared: Arc<Shared>,
    completions: mpsc::Sender<Completion>,
    shutdown: CancellationToken,
    interrupt: CancellationToken,
) {
    let settings = &shared.settings;
    let state = Arc::new(ClaimState::default());
    let most_claims = most_claims(settings.batch_size, settings.concurrency);
    let claim_gate = Arc::new(tokio::sync::Semaphore::new(most_claims));
    *lock(&state.target) = InFlightTarget::new(most_claims);
    *lock(&state.size) = ClaimSize::new(settings.batch_size, settings.concurrency);
    let ahead_room = ClaimSize::ahead_room(settings.batch_size, settings.concurrency);
    let ahead = Arc::new(tokio::sync::Semaphore::new(ahead_room));
    let mut claims = tokio::task::JoinSet::new();
    // Shared by reference count: every job's runner holds it, and cloning
    // the token itself takes its lock, one more lock a job on a token every
    // runner shares.
    let interrupt = Arc::new(interrupt);
    loop {
        // Reap finished claim tasks so the set does not grow without bound.
        while claims.try_join_next().is_some() {}

        // A wake-up taken while idle. A claim still in flight with an older
        // snapshot may come back empty after it and mark the queue empty
        // again; the claim below must go ahead anyway, or the job that
        // wake-up announced would wait for the poll interval.
        let mut woken_idle = false;
        if state.queue_empty.load(Ordering::Acquire) || state.failing.load(Ordering::Acquire) {
            let timeout = if state.failing.load(Ordering::Acquire) {
                settings.poll_interval.min(Duration::from_secs(1))
            } else {
                shared.liveness.producer_progressed();
                settings.poll_interval
            };
            match wait(&shared, &shutdown, timeout).await {
                Waited::Shutdown => break,
                Waited::Woken => woken_idle = true,
                Waited::TimedOut => {}
            }
            state.queue_empty.store(false, Ordering::Release);
        }

        // No more claims in flight than the queue's depth has earned.
        while state.claiming.load(Ordering::Acquire) >= lock(&state.target).get() {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                () = state.claim_ended.notified() => {}
            }
        }
        // Held until the claim returns; see the bound above.
        let gate = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            permit = Arc::clone(&claim_gate).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        // Wait for one free slot (or, while claims run ahead of the slots,
        // room ahead), then take whatever else is free without waiting.
        let size = *lock(&state.size);
        let pool = if size.ahead() {
            Arc::clone(&ahead)
        } else {
            Arc::clone(&shared.slots)
        };
        let first = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            permit = Arc::clone(&pool).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break, // the semaphores are never closed; treat as shutdown
            },
        };
        let mut permits = vec![first];
        take_free(&pool, &mut permits, size.get());
        let busy = Busy {
            state: &state,
            ahead: &ahead,
            ahead_room,
        };
        // A claim below the batch size takes free slots, never more than
        // there are; one above it takes room ahead, and waits for a batch.
        let enough = if size.ahead() {
            settings.batch_size
        } else {
            settings.batch_size.min(settings.concurrency)
        };
        if !gather(&pool, &mut permits, enough, &busy, &shutdown).await {
            break;
        }
        let room = if size.ahead() {
            Room::Ahead(permits)
        } else {
            Room::Slots(permits)
        };
        // A NOTIFY that came while we were claiming without a pause: the job
        // it announces may be behind the cursor.
        let woken = shared.wake.notified().now_or_never().is_some() || woken_idle;
        if woken {
            lock(&state.cursor).restart();
        }
        // An empty queue seen while we waited for the slot: do not claim
        // blindly. Unless we just took a wake-up: the empty answer may come
        // from a claim whose snapshot predates the job that NOTIFY announced,
        // and the wake-up is spent, so skipping this claim would leave that
        // job to the poll interval.
        if !woken && state.queue_empty.load(Ordering::Acquire) {
            drop(room);
            continue;
        }
        // Counted here, not in the task, so the loop's next check sees it.
        state.claiming.fetch_add(1, Ordering::AcqRel);
        claims.spawn(claim_and_start(
            Arc::clone(&shared),
            Arc::clone(&state),
            gate,
            room,
            size.get(),
            completions.clone(),
            shutdown.clone(),
            Arc::clone(&interrupt),
        ));
        // Let the claim task run before deciding whether to claim again, so an
        // empty queue is noticed before we fire more claims at it.
        tokio::task::yield_now().await;
    }
    // Claims still in flight finish (and release what they got) before we return.
    while claims.join_next().await.is_some() {}
}

/// What the claim tasks tell the producer.
#[derive(Debug, Default)]
struct ClaimState {
    /// The last claim came back short: nothing more is due for us right now.
    queue_empty: AtomicBool,
    /// Claims are failing (database unreachable): back off before the next.
    failing: AtomicBool,
    /// Claims of this worker pool under way.
    claiming: AtomicUsize,
    /// How many claims may be under way now.
    target: Mutex<InFlightTarget>,
    /// How many jobs the next claim asks for.
    size: Mutex<ClaimSize>,
    /// How long claims take to come back.
    claim_time: MovingAverage,
    /// Told whenever a claim returns.
    claim_ended: tokio::sync::Notify,
    cursor: Mutex<Cursor>,
    /// When a claim last took a job with a concurrency key.
    keyed_at: Mutex<Option<Instant>>,
}

/// How soon a worker pool that has been taking keyed jobs claims again after a
/// short claim. A key held back by its limits gets room with nothing to
/// wake anyone: a token comes due, or a slot frees on another worker pool. Until
/// [`KEYED_LINGER`] after its last keyed job, the worker pool looks again this
/// often instead of at the poll interval: a key at 5 a second gets a token
/// every 200 ms and would otherwise run at one job per poll.
const KEYED_POLL: Duration = Duration::from_millis(100);
/// How long after its last keyed job a worker pool keeps claiming every
/// [`KEYED_POLL`]: longer than the gap between two tokens of a key at 0.2 a
/// second; slower keys wait for the poll interval or a NOTIFY.
const KEYED_LINGER: Duration = Duration::from_secs(5);

/// What keeps a worker pool's slots busy without a new claim.
struct Busy<'a> {
    state: &'a ClaimState,
    ahead: &'a tokio::sync::Semaphore,
    ahead_room: usize,
}

impl Busy<'_> {
    /// Another claim is under way, or jobs claimed ahead wait for slots.
    fn now(&self) -> bool {
        self.state.claiming.load(Ordering::Acquire) > 0
            || self.ahead.available_permits() < self.ahead_room
    }
}

/// Waits until `permits` holds `enough` of `pool`, while the slots are kept
/// busy otherwise. Without it, on a deep queue of effects that each free a
/// slot a little apart, every freed slot (or room ahead) started a claim of
/// its own: the publish drain made claims of one job, a statement each.
/// With nothing else under way a claim goes with what is free, so an idle
/// worker pool still claims a job the moment it is announced. `false` at
/// shutdown.
async fn gather(
    pool: &Arc<tokio::sync::Semaphore>,
    permits: &mut Vec<OwnedSemaphorePermit>,
    enough: usize,
    busy: &Busy<'_>,
    shutdown: &CancellationToken,
) -> bool {
    while permits.len() < enough && busy.now() {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return false,
            permit = Arc::clone(pool).acquire_owned() => match permit {
                Ok(permit) => {
                    permits.push(permit);
                    take_free(pool, permits, enough);
                }
                Err(_) => return false,
            },
            () = busy.state.claim_ended.notified() => {}
        }
    }
    true
}

/// Adds free permits of `pool` to `permits` without waiting, up to `batch`.
fn take_free(
    pool: &Arc<tokio::sync::Semaphore>,
    permits: &mut Vec<OwnedSemaphorePermit>,
    batch: usize,
) {
    while permits.len() < batch {
        match Arc::clone(pool).try_acquire_owned() {
            Ok(permit) => permits.push(permit),
            Err(_) => break,
        }
    }
}

/// The room a claim holds, one permit per job it asks for.
#[derive(Debug)]
enum Room {
    /// Slots: each job claimed starts at once.
    Slots(Vec<OwnedSemaphorePermit>),
    /// Room ahead of the slots: each job claimed waits for a slot, in claim
    /// order, holding its permit until it has one.
    Ahead(Vec<OwnedSemaphorePermit>),
}

impl Room {
    fn len(&self) -> usize {
        match self {
            Room::Slots(permits) | Room::Ahead(permits) => permits.len(),
        }
    }
}

#[expect(
    clippy::too_many_arguments,
    reason = "one claim task's inputs, each from a different owner"
)]
async fn claim_and_start(
    shared: Arc<Shared>,
    state: Arc<ClaimState>,
    gate: OwnedSemaphorePermit,
    room: Room,
    size: usize,
    completions: mpsc::Sender<Completion>,
    shutdown: CancellationToken,
    interrupt: Arc<CancellationToken>,
) {
    let wanted = room.len();
    let asked = Instant::now();
    let from = lock(&state.cursor).start(asked);
    let claimed = claim(&shared, wanted, from).await;
    state.claim_time.record(asked.elapsed());
    let siblings = state.claiming.fetch_sub(1, Ordering::AcqRel) - 1;
    drop(gate);
    let got = claimed.as_ref().map_or(0, Vec::len);
    lock(&state.target).claimed(got, wanted);
    let effects_fast = effects_fast(shared.effect_time.get(), state.claim_time.get());
    lock(&state.size).claimed(got, wanted, size, effects_fast);
    state.claim_ended.notify_one();
    let jobs = match claimed {
        Ok(jobs) => {
            shared.liveness.producer_progressed();
            if state.failing.swap(false, Ordering::AcqRel) {
                tracing::info!("claiming works again");
            }
            jobs
        }
        Err(error) => {
            // Never read a database error as "no job": say so, back off, retry.
            if !state.failing.swap(true, Ordering::AcqRel) {
                tracing::warn!(error = %error, "claiming jobs failed; retrying");
            }
            if error.failure() == Failure::Unavailable {
                shared
                    .liveness
                    .producer_waiting_for_database(error.to_string());
            } else {
                shared.liveness.producer_failed(error.to_string());
            }
            metrics::counter!("outbox_claim_errors_total").increment(1);
            return;
        }
    };
    // Keyed jobs come through their keys, outside the cursor's order: only
    // the keyless ones say where the claim's ordered scan ended.
    let end = jobs
        .iter()
        .filter(|(job, _)| job.concurrency_key.is_none())
        .map(|(job, _)| job.position())
        .max();
    lock(&state.cursor).claimed(from, end, jobs.len(), wanted);
    // A short claim from the cursor may have missed jobs behind it: the next
    // claim, from the front, decides whether the queue is empty. So may a
    // claim that ran beside others of this worker pool: SKIP LOCKED stepped over
    // the rows they were taking, and the queue behind them may be long (taking
    // it for empty would stall the worker pool for a poll interval in the middle of
    // a drain).
    let now = Instant::now();
    let keyed_at = {
        let mut keyed_at = state.keyed_at.lock().unwrap_or_else(|e| e.into_inner());
        if jobs.iter().any(|(job, _)| job.concurrency_key.is_some()) {
            *keyed_at = Some(now);
        }
        *keyed_at
    };
    if jobs.len() < wanted && keyed_at.is_some_and(|at| now.duration_since(at) < KEYED_LINGER) {
        shared.wake_at(now + KEYED_POLL);
    }
    if jobs.len() < wanted && from.is_none() && siblings == 0 {
        state.queue_empty.store(true, Ordering::Release);
    } else if jobs.len() == wanted {
        state.queue_empty.store(false, Ordering::Release);
    }
    if jobs.is_empty() {
        return;
    }
    if shutdown.is_cancelled() {
        // Claimed while shutdown was asked for: hand them back untouched.
        hand_back(&shared, jobs).await;
        return;
    }
    metrics::histogram!("outbox_claim_batch_size").record(jobs.len() as f64);
    PoolStats::add(&shared.stats.claims, 1);
    PoolStats::add(&shared.stats.claimed, jobs.len() as u64);
    shared
        .executor
        .claimed(&jobs.iter().map(|(job, _)| job).collect::<Vec<_>>());
    match room {
        Room::Slots(mut permits) => start(&shared, jobs, &mut permits, &completions, &interrupt),
        Room::Ahead(permits) => {
            start_in_turn(&shared, jobs, permits, &completions, &shutdown, &interrupt).await;
        }
    }
}

/// Starts jobs claimed ahead of the slots, in claim order, each as a slot
/// frees; each job's room ahead is given back as it starts. Jobs still
/// waiting at shutdown are handed back untouched, as [`release`] does.
async fn start_in_turn(
    shared: &Arc<Shared>,
    jobs: Vec<(ClaimedJob, Claim)>,
    mut ahead: Vec<OwnedSemaphorePermit>,
    completions: &mpsc::Sender<Completion>,
    shutdown: &CancellationToken,
    interrupt: &Arc<CancellationToken>,
) {
    let mut jobs = jobs.into_iter();
    while let Some((job, claim)) = jobs.next() {
        if claim.lost().is_cancelled() {
            // Reaped while it waited: another worker pool may own it now.
            drop(claim);
            ahead.pop();
            continue;
        }
        let slot = tokio::select! {
            biased;
            () = shutdown.cancelled() => None,
            permit = Arc::clone(&shared.slots).acquire_owned() => permit.ok(),
        };
        let Some(slot) = slot else {
            let mut unstarted = vec![(job, claim)];
            unstarted.extend(jobs);
            hand_back(shared, unstarted).await;
            return;
        };
        ahead.pop();
        let mut permits = vec![slot];
        start(
            shared,
            vec![(job, claim)],
            &mut permits,
            completions,
            interrupt,
        );
    }
}

async fn claim(
    shared: &Arc<Shared>,
    limit: usize,
    from: Option<ClaimPosition>,
) -> Result<Vec<(ClaimedJob, Claim)>, crate::db::DbError> {
    let jobs = shared.hot.claim(limit, from).await?;
    // Registered as soon as the claim returns, so the heartbeat covers each
    // job from its first moment.
    Ok(shared.in_flight.register_all(jobs))
}

fn start(
    shared: &Arc<Shared>,
    jobs: Vec<(ClaimedJob, Claim)>,
    permits: &mut Vec<OwnedSemaphorePermit>,
    completions: &mpsc::Sender<Completion>,
    interrupt: &Arc<CancellationToken>,
) {
    // A claim's jobs are mostly of one kind: its metrics are looked up once
    // a run of it, not once a job under the cache's shared lock.
    let mut last: Option<Arc<KindMetrics>> = None;
    for (job, claim) in jobs {
        let kind = match last.take() {
            Some(kind) if *kind.kind == *job.kind => kind,
            _ => shared.kinds.of(&job.kind),
        };
        last = Some(Arc::clone(&kind));
        kind.claimed.increment(1);
        let Some(permit) = permits.pop() else {
            // Cannot happen: the claim asked for permits.len() jobs at most.
            tracing::error!(job_id = job.id, "claimed more jobs than free slots");
            break;
        };
        // Boxed: the task then holds a pointer, not the runner's whole state
        // machine, which tokio would otherwise copy at each stage of the task.
        tokio::spawn(Box::pin(executor::run(
            Arc::clone(shared),
            job,
            kind,
            claim,
            permit,
            completions.clone(),
            Arc::clone(interrupt),
        )));
    }
}

/// Returns claimed-but-unstarted jobs to `pending` without spending an attempt.
/// Their claims end when `jobs` is dropped, after the release.
async fn hand_back(shared: &Arc<Shared>, jobs: Vec<(ClaimedJob, Claim)>) {
    let leases: Vec<JobLease> = jobs.iter().map(|(_, claim)| claim.lease).collect();
    match shared.hot.hand_back(leases.clone()).await {
        Ok(handed_back) => {
            PoolStats::add(&shared.stats.handed_back, handed_back.len() as u64);
            tracing::info!(
                handed_back = handed_back.len(),
                "handed back unstarted jobs at shutdown"
            );
        }
        Err(error) => tracing::warn!(
            error = %error,
            jobs = leases.len(),
            "could not release unstarted jobs; the reaper will requeue them when their lease expires"
        ),
    }
    drop(jobs);
}

/// How an idle wait ended.
enum Waited {
    Shutdown,
    /// A wake-up (a NOTIFY, a released job, a freed slot): it is spent.
    Woken,
    /// The poll interval, or a retry this worker pool scheduled, came due.
    TimedOut,
}

/// Sleeps until woken, the timeout, a retry this worker pool scheduled falls due, or
/// shutdown.
async fn wait(shared: &Shared, shutdown: &CancellationToken, timeout: Duration) -> Waited {
    let poll_at = Instant::now() + timeout;
    loop {
        let until = shared.next_wake().map_or(poll_at, |at| at.min(poll_at));
        tokio::select! {
            () = shutdown.cancelled() => return Waited::Shutdown,
            () = shared.wake.notified() => return Waited::Woken,
            // A retry scheduled while we slept may be due before `until`.
            () = shared.rescheduled.notified() => {}
            () = tokio::time::sleep_until(until.into()) => return Waited::TimedOut,
        }
    }
}
