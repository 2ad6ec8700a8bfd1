//! The bench's results: a readable table and one JSON line.
//!
//! The runs and the report that collects them are here; how the report reads
//! as a table is in `table`, as JSON in `json`.

mod json;
mod open_loop;
mod table;

use super::BenchArgs;
use super::percentiles::Latency;
use super::stats::{DbCost, ServerCounters};

#[derive(Debug, Clone)]
pub struct DrainRun {
    pub jobs: usize,
    pub batch: usize,
    pub seconds: f64,
    pub server: ServerCounters,
    pub relay_peak_rss_kib: Option<u64>,
    /// CPU seconds of the relay process (the ceiling: of this process).
    pub cpu_seconds: Option<f64>,
    /// CPU seconds of every PostgreSQL process here over the drain.
    pub server_cpu_seconds: Option<f64>,
    /// Claim loops (the ceiling only).
    pub workers: Option<usize>,
    /// What the drain cost the database, per job.
    pub cost: Option<DbCost>,
    /// How long the pinned horizon was held, when this drain ran under one.
    pub pinned_for: Option<std::time::Duration>,
}

impl DrainRun {
    pub fn new(
        jobs: usize,
        batch: usize,
        seconds: f64,
        server: ServerCounters,
        relay_peak_rss_kib: Option<u64>,
        cpu_seconds: Option<f64>,
    ) -> Self {
        DrainRun {
            jobs,
            batch,
            seconds,
            server,
            relay_peak_rss_kib,
            cpu_seconds,
            server_cpu_seconds: None,
            workers: None,
            cost: None,
            pinned_for: None,
        }
    }

    pub fn with_cost(mut self, cost: DbCost) -> Self {
        self.cost = Some(cost);
        self
    }

    pub fn with_pin(mut self, held: std::time::Duration) -> Self {
        self.pinned_for = Some(held);
        self
    }

    pub fn with_server_cpu(mut self, seconds: Option<f64>) -> Self {
        self.server_cpu_seconds = seconds;
        self
    }

    pub fn with_workers(mut self, workers: usize) -> Self {
        self.workers = Some(workers);
        self
    }

    pub fn jobs_per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            self.jobs as f64 / self.seconds
        } else {
            0.0
        }
    }
    fn per_job(&self, total: i64) -> f64 {
        total as f64 / self.jobs.max(1) as f64
    }
    fn cpu_per_10k(&self) -> Option<f64> {
        self.cpu_seconds
            .map(|c| c * 10_000.0 / self.jobs.max(1) as f64)
    }
    fn server_cpu_per_10k(&self) -> Option<f64> {
        self.server_cpu_seconds
            .map(|c| c * 10_000.0 / self.jobs.max(1) as f64)
    }
}

#[derive(Debug, Clone)]
pub struct BenchReport {
    pub jobs: usize,
    pub batch: usize,
    pub concurrency: usize,
    pub ceiling: Vec<DrainRun>,
    pub relay: Vec<DrainRun>,
    pub ceiling_batch1: Vec<DrainRun>,
    pub relay_batch1: Vec<DrainRun>,
    pub latency: Option<Latency>,
    pub placement: Option<super::placement::Placement>,
    /// `--effects real`: drains of email and webhook jobs at `batch`.
    pub real: Vec<DrainRun>,
    /// `--pinned-horizon`: relay drains at `batch` under a pinned horizon,
    /// one per round, each next to that round's unpinned `relay` drain.
    pub pinned: Vec<DrainRun>,
    pub pinned_horizon: Option<std::time::Duration>,
    /// Enqueue-to-start latency while the API takes orders.
    pub latency_loaded: Option<super::latency::LoadedLatency>,
    /// `--concurrency-keys`: relay drains at `batch` of jobs spread over
    /// that many keys, one per round, each next to that round's keyless drain.
    pub keyed: Vec<DrainRun>,
    pub concurrency_keys: Option<usize>,
    /// `--baseline-relay`: drains at `batch` by another build's relay, one per
    /// round, each right after that round's `relay` drain.
    pub baseline: Vec<DrainRun>,
    pub baseline_relay: Option<std::path::PathBuf>,
    /// `--against-defaults`: drains at the relay's defaults, one per round,
    /// each right after that round's `relay` drain.
    pub defaults: Vec<DrainRun>,
    /// `--arrival-rate`: `--repeat` runs per rate, in the order given.
    pub open_loop: Vec<super::open_loop::OpenLoopRun>,
    /// `--growth`.
    pub growth: Option<super::growth::Growth>,
}

/// The share of a real job's wall time that a `noop` job, which is nothing
/// but the relay's machinery, takes at the same settings.
fn machinery_share(real: &DrainRun, noop: &DrainRun) -> f64 {
    let noop_rate = noop.jobs_per_second();
    if noop_rate > 0.0 {
        real.jobs_per_second() / noop_rate
    } else {
        f64::NAN
    }
}

/// Pinned throughput over unpinned.
fn pinned_ratio(pinned: &DrainRun, free: &DrainRun) -> f64 {
    let free_rate = free.jobs_per_second();
    if free_rate > 0.0 {
        pinned.jobs_per_second() / free_rate
    } else {
        f64::NAN
    }
}

/// The run with the median throughput.
fn median(runs: &[DrainRun]) -> Option<&DrainRun> {
    let mut sorted: Vec<&DrainRun> = runs.iter().collect();
    sorted.sort_by(|a, b| a.jobs_per_second().total_cmp(&b.jobs_per_second()));
    sorted.get(sorted.len() / 2).copied()
}

impl BenchReport {
    pub fn new(args: &BenchArgs) -> Self {
        BenchReport {
            jobs: args.jobs,
            batch: args.batch,
            concurrency: args.concurrency,
            ceiling: Vec::new(),
            relay: Vec::new(),
            ceiling_batch1: Vec::new(),
            relay_batch1: Vec::new(),
            latency: None,
            placement: None,
            real: Vec::new(),
            pinned: Vec::new(),
            pinned_horizon: args.pinned_horizon,
            latency_loaded: None,
            keyed: Vec::new(),
            concurrency_keys: args.concurrency_keys,
            baseline: Vec::new(),
            baseline_relay: args.baseline_relay.clone(),
            defaults: Vec::new(),
            open_loop: Vec::new(),
            growth: None,
        }
    }

    fn pairs(&self) -> Vec<(usize, Option<&DrainRun>, Option<&DrainRun>)> {
        let mut pairs = vec![(self.batch, median(&self.relay), median(&self.ceiling))];
        if !self.relay_batch1.is_empty() {
            pairs.push((1, median(&self.relay_batch1), median(&self.ceiling_batch1)));
        }
        pairs
    }
}
