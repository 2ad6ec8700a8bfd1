//! How a worker pool behaves ([`PoolSettings`]), the defaults an application
//! starts from, and the checks [`WorkerPool::new`] makes.

use std::time::Duration;

use super::completer;
use super::{BackoffPolicy, JobTimeouts};
#[cfg(doc)]
use super::{Liveness, WorkerPool};
use crate::outbox::{Enqueuer, PeriodicJob};

/// Default [`PoolSettings::concurrency`]: effects in flight at once per worker pool.
///
/// 64, not 16: at 16 only one claim of 16 can be in flight, and a worker pool beside
/// a busy producer falls behind (docs/performance.md has the figures). More
/// slots cost no more connections:
/// claims and outcomes run on the worker pool's own, and the pool the effects use
/// stops growing at 16 + 4. A shallow queue still gets one claim at a time.
pub const DEFAULT_CONCURRENCY: usize = 64;
/// Default [`PoolSettings::batch_size`]: the jobs a claim statement asks for
/// while the queue is shallow, and where a worker pool's claims start.
pub const DEFAULT_BATCH_SIZE: usize = 16;
/// Default [`PoolSettings::lease`]; the heartbeat, reap interval and reap
/// margin derive from it (see [`PoolSettings::with_lease`]).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
/// Default [`PoolSettings::poll_interval`]: the longest an idle worker pool goes
/// without looking for due jobs when no NOTIFY wakes it.
pub(crate) const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Default [`PoolSettings::shutdown_grace`].
pub(crate) const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// Default [`PoolSettings::stall_timeout`].
pub(crate) const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(120);
/// The shortest lease a worker pool accepts: below it, the heartbeat (a third of
/// the lease) would renew faster than a database round trip can be relied on.
pub const MIN_LEASE: Duration = Duration::from_millis(100);

/// How a worker pool behaves; an application fills it from its own configuration.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// `locked_by` on the jobs this worker pool claims; unique per live worker pool. Shown
    /// in the reaper's `last_error` when a lease of this worker pool expires. Must
    /// not be empty.
    pub worker_id: String,
    /// Kinds this worker pool claims (`--kinds`); also the NOTIFY payloads it wakes
    /// on. At least one. With a [`Workers`](crate::worker::Workers)
    /// executor, a kind with no worker registered fails its jobs permanently
    /// as an unknown kind.
    pub kinds: Vec<String>,
    /// Effects in flight at most (at least 1): the worker pool's slots. A claim
    /// never asks for more jobs than there are free slots.
    pub concurrency: usize,
    /// Jobs per claim to start with, and again whenever a claim comes back
    /// short (at least 1). Never more than the free slots at this size; on a
    /// deep queue of fast effects claims grow past it, taking jobs ahead of
    /// the slots (see the producer's `ClaimSize`).
    pub batch_size: usize,
    /// How long a claimed job is ours without a heartbeat (at least 100 ms).
    /// Set it with [`PoolSettings::with_lease`] to keep the periods derived
    /// from it in step.
    pub lease: Duration,
    /// Fallback poll when no NOTIFY arrives: the longest a due job waits for
    /// an idle worker pool while LISTEN is down or a wake-up was lost. Positive.
    pub poll_interval: Duration,
    /// How long in-flight effects may run on after shutdown is asked for;
    /// then they are interrupted and recorded as retryable failures (see
    /// [`WorkerPool::run_until_stopped`]).
    pub shutdown_grace: Duration,
    /// Delays between attempts after a retryable failure, and before a job
    /// the reaper requeued runs again.
    pub backoff: BackoffPolicy,
    /// Heartbeat period; a third of the lease, so two can be missed.
    pub heartbeat_interval: Duration,
    /// Reaper period; half the lease, so a dead worker's job waits at most
    /// a lease and a half before it is reaped. Every worker pool runs a reaper;
    /// each expired job goes to exactly one of them.
    pub reap_interval: Duration,
    /// How long past its expiry a lease must be before the reaper takes it, so
    /// a worker pool back from a short blip renews its leases before anyone reaps
    /// them; a quarter of the lease.
    pub reap_margin: Duration,
    /// The deadline of one effect, by kind (`RELAY_JOB_TIMEOUT`).
    pub job_timeouts: JobTimeouts,
    /// `/livez` fails once a loop has made no progress for this long although
    /// it had work (see [`Liveness`]). Taken as at least two poll intervals,
    /// so an idle worker pool is never taken for a stuck one.
    pub stall_timeout: Duration,
    /// Wake on LISTEN/NOTIFY (off only in tests and benchmarks of polling).
    pub listen: bool,
    /// Completer writers: statements writing outcomes side by side, each on
    /// a connection of its own. `None`: two (one at concurrency 1).
    pub completer_writers: Option<usize>,
    /// Periodic jobs this worker pool enqueues at their slots: each (name, slot)
    /// once across every worker pool that declares it, and a slot missed while
    /// every worker pool was down once, not once per missed slot (see
    /// [`PeriodicJob`]). Names must be distinct. The worker pool sleeps until the
    /// next slot: no poll of its own.
    pub periodic_jobs: Vec<PeriodicJob>,
    /// How the periodic jobs are enqueued: an application that added columns
    /// of its own to `jobs` gives its [`Enqueuer`] here.
    pub periodic_enqueuer: Enqueuer,
}

impl PoolSettings {
    /// Settings for a worker pool of `worker_id` claiming `kinds`, with every other
    /// field at its default (`DEFAULT_*`, a lease of [`DEFAULT_LEASE`] and the
    /// periods derived from it, LISTEN on). [`WorkerPool::new`] checks them.
    pub fn new(worker_id: impl Into<String>, kinds: Vec<String>) -> Self {
        PoolSettings {
            worker_id: worker_id.into(),
            kinds,
            concurrency: DEFAULT_CONCURRENCY,
            batch_size: DEFAULT_BATCH_SIZE,
            lease: DEFAULT_LEASE,
            poll_interval: DEFAULT_POLL_INTERVAL,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            backoff: BackoffPolicy::default(),
            heartbeat_interval: DEFAULT_LEASE / 3,
            reap_interval: DEFAULT_LEASE / 2,
            reap_margin: DEFAULT_LEASE / 4,
            job_timeouts: JobTimeouts::default(),
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            listen: true,
            completer_writers: None,
            periodic_jobs: Vec::new(),
            periodic_enqueuer: Enqueuer::new(),
        }
    }

    /// Sets the lease and the heartbeat and reaper periods and the reap
    /// margin that derive from it.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self.heartbeat_interval = lease / 3;
        self.reap_interval = lease / 2;
        self.reap_margin = lease / 4;
        self
    }

    /// Completer writers in force (see [`PoolSettings::completer_writers`]).
    pub(super) fn writers(&self) -> usize {
        self.completer_writers
            .unwrap_or_else(|| completer::writers_for(self.concurrency))
    }

    /// The stall timeout in force: never shorter than two polls, so an idle
    /// worker pool waiting out its poll interval is never taken for a stuck one.
    pub(super) fn effective_stall_timeout(&self) -> Duration {
        self.stall_timeout.max(self.poll_interval * 2)
    }

    pub(super) fn validate(&self) -> Result<(), InvalidSettings> {
        let refuse = |why: String| Err(InvalidSettings(why));
        if self.worker_id.is_empty() {
            return refuse("the worker id must not be empty".into());
        }
        if self.kinds.is_empty() {
            return refuse("the relay must handle at least one kind".into());
        }
        if self.concurrency == 0 {
            return refuse("concurrency must be at least 1".into());
        }
        if self.batch_size == 0 {
            return refuse("the batch size must be at least 1".into());
        }
        if self.completer_writers == Some(0) {
            return refuse("the completer needs at least 1 writer".into());
        }
        if self.lease < MIN_LEASE {
            return refuse(format!(
                "the lease must be at least {}",
                humantime::format_duration(MIN_LEASE)
            ));
        }
        let periods = [
            ("heartbeat interval", self.heartbeat_interval),
            ("reap interval", self.reap_interval),
            ("poll interval", self.poll_interval),
            ("stall timeout", self.stall_timeout),
        ];
        if let Some((name, _)) = periods.iter().find(|(_, d)| d.is_zero()) {
            return refuse(format!("the {name} must be positive"));
        }
        let mut names: Vec<&str> = self.periodic_jobs.iter().map(PeriodicJob::name).collect();
        names.sort_unstable();
        if let Some(twice) = names.windows(2).find(|pair| pair[0] == pair[1]) {
            return refuse(format!("periodic job {:?} is declared twice", twice[0]));
        }
        self.job_timeouts.validate().map_err(InvalidSettings)
    }
}

/// Why [`WorkerPool::new`] refused its [`PoolSettings`]: which setting, and what
/// it must be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidSettings(String);

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Sweep {}
    impl crate::worker::JobArgs for Sweep {
        const KIND: &'static str = "sweep";
    }

    #[test]
    fn two_periodic_jobs_of_one_name_are_refused_naming_it() {
        let every = PeriodicJob::every("sweep", Duration::from_secs(60), &Sweep {}).expect("valid");
        let nightly = PeriodicJob::cron("sweep", "0 3 * * *", &Sweep {}).expect("valid");
        let mut settings = PoolSettings::new("relay", vec!["sweep".into()]);
        settings.periodic_jobs = vec![every];
        assert_eq!(settings.validate(), Ok(()));
        settings.periodic_jobs.push(nightly);
        let error = settings.validate().expect_err("a name twice");
        assert!(error.to_string().contains("\"sweep\""), "{error}");
    }
}
