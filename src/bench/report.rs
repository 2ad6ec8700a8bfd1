//! The bench's results: a readable table and one JSON line.

use serde_json::json;

use super::BenchArgs;
use super::stats::{DbCost, ServerCounters, finite};

#[derive(Debug, Clone)]
pub struct DrainRun {
    pub jobs: usize,
    pub batch: usize,
    pub seconds: f64,
    pub server: ServerCounters,
    pub relay_peak_rss_kib: Option<u64>,
    /// CPU seconds of the relay process (the ceiling: of this process).
    pub cpu_seconds: Option<f64>,
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
}

#[derive(Debug, Clone)]
pub struct Latency {
    pub samples: usize,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    pub fn from_sorted_micros(sorted: &[u64]) -> Latency {
        let pick = |q: f64| -> f64 {
            if sorted.is_empty() {
                return f64::NAN;
            }
            // Nearest rank.
            let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
            sorted[rank - 1] as f64 / 1000.0
        };
        Latency {
            samples: sorted.len(),
            p50_ms: pick(0.50),
            p95_ms: pick(0.95),
            p99_ms: pick(0.99),
            max_ms: pick(1.0),
        }
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
    pub placement: Option<super::orders::Placement>,
    /// `--effects real`: drains of email and webhook jobs at `batch`.
    pub real: Vec<DrainRun>,
    /// `--pinned-horizon`: relay drains at `batch` under a pinned horizon,
    /// one per round, each next to that round's unpinned `relay` drain.
    pub pinned: Vec<DrainRun>,
    pub pinned_horizon: Option<std::time::Duration>,
    /// Enqueue-to-start latency while the API takes orders.
    pub latency_loaded: Option<super::latency::LoadedLatency>,
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

/// One line of the drain table; `ratio` against the ceiling, when there is one.
fn row(name: &str, batch: usize, run: &DrainRun, ratio: Option<f64>) -> String {
    let or_dash = |value: Option<String>| value.unwrap_or_else(|| "-".into());
    format!(
        "{:<28} {:>6} {:>10.0} {:>8} {:>9.2} {:>10.0} {:>11} {:>9}\n",
        name,
        batch,
        run.jobs_per_second(),
        or_dash(ratio.map(|r| format!("{r:.2}x"))),
        run.per_job(run.server.transactions),
        run.per_job(run.server.wal_bytes),
        or_dash(run.cpu_per_10k().map(|c| format!("{c:.2}"))),
        or_dash(
            run.relay_peak_rss_kib
                .map(|k| format!("{:.1}", k as f64 / 1024.0))
        ),
    )
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

/// A drain's cost, for the JSON line.
fn cost_json(c: &DbCost) -> serde_json::Value {
    json!({
        "wal_bytes_per_job_enqueue": c.wal_enqueue_per_job(),
        "wal_bytes_per_job_drain": c.wal_drain_per_job(),
        "index_entries_per_job": c.index_entries_per_job_estimate(),
        "index_entries_per_job_from_wal": c.index_entries_per_job_wal(),
        "index_entries_from_wal": c.index_entries_wal.as_ref().map(|rows| {
            rows.iter().map(|(name, n)| (name.clone(), json!(n))).collect::<serde_json::Map<_, _>>()
        }),
        "index_factors": {
            "inserted": c.layout.inserted,
            "claimed": c.layout.claimed,
            "done_in_place": c.layout.done_in_place,
            "archived": c.layout.archived,
        },
        "jobs_inserts": c.tables.jobs_ins,
        "jobs_updates": c.tables.jobs_upd,
        "jobs_hot_updates": c.tables.jobs_hot_upd,
        "jobs_deletes": c.tables.jobs_del,
        "jobs_done_inserts": c.tables.done_ins,
        "done_in_place": c.done_in_place,
        "hot_update_share": finite(c.hot_share()),
        "heap_buffers_per_job": c.heap_blks_per_job(),
        "index_buffers_per_job": c.idx_blks_per_job(),
        "dead_tuples_before": c.dead_before,
        "dead_tuples_after": c.dead_after,
    })
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
        }
    }

    /// Every drain that has a cost, with the name it has in the report.
    fn costed_runs(&self) -> Vec<(String, &DrainRun)> {
        let mut runs = Vec::new();
        for (batch, relay, ceiling) in self.pairs() {
            for (name, run) in [("raw SQL ceiling", ceiling), ("relay", relay)] {
                if let Some(run) = run {
                    runs.push((format!("{name}, batch {batch}"), run));
                }
            }
        }
        if let Some(run) = median(&self.pinned) {
            runs.push((format!("relay, batch {}, pinned", run.batch), run));
        }
        if let Some(run) = median(&self.real) {
            runs.push((format!("relay, batch {}, real effects", run.batch), run));
        }
        runs.retain(|(_, run)| run.cost.is_some());
        runs
    }

    fn cost_table(&self) -> String {
        let runs = self.costed_runs();
        let Some(layout) = runs
            .iter()
            .find_map(|(_, r)| r.cost.as_ref().map(|c| &c.layout))
        else {
            return String::new();
        };
        let mut out = String::new();
        out.push_str(&format!(
            "\nper-job database cost (WAL from pg_current_wal_lsn around each phase; row counts from \
             pg_stat_user_tables of jobs and jobs_done's partitions):\n\
             {:<34} {:>8} {:>8} {:>9} {:>9} {:>7} {:>8} {:>8} {:>15}\n",
            "run", "WAL enq", "WAL drn", "idx ent", "(WAL)", "HOT", "heap buf", "idx buf", "dead tup"
        ));
        for (name, run) in &runs {
            let Some(c) = &run.cost else { continue };
            out.push_str(&format!(
                "{:<34} {:>8.0} {:>8.0} {:>9.2} {:>9} {:>6.0}% {:>8.2} {:>8.2} {:>15}\n",
                name,
                c.wal_enqueue_per_job(),
                c.wal_drain_per_job(),
                c.index_entries_per_job_estimate(),
                c.index_entries_per_job_wal()
                    .map(|n| format!("{n:.2}"))
                    .unwrap_or_else(|| "-".into()),
                c.hot_share() * 100.0,
                c.heap_blks_per_job(),
                c.idx_blks_per_job(),
                format!("{} -> {}", c.dead_before, c.dead_after),
            ));
        }
        out.push_str(&format!(
            "  WAL enq / WAL drn: WAL bytes per job of the enqueue's transaction and of the drain (the \
             server's whole WAL: run on a quiet server).\n\
             \x20 idx ent: index entries written per job over enqueue and drain = (jobs inserts x {ins} \
             + in-place finishes x {done} + other non-HOT updates of jobs x {claimed} + jobs_done inserts \
             x {archived}) / jobs: each factor is the number of btree indexes that version of a bench job \
             (no order_id, no ordering_key) satisfies, partial predicates evaluated from pg_index; a HOT \
             update, a DELETE and a BRIN index add no entry.\n\
             \x20 (WAL): the same, counted exactly from the WAL's btree leaf-insert records on those \
             indexes (pg_walinspect; '-' when unavailable).\n\
             \x20 HOT: HOT updates of jobs over all its updates. heap buf / idx buf: buffer accesses (hits + \
             reads, pg_statio_user_tables) of jobs' heap and of all its indexes over the drain, by every \
             statement (claims, finishes, heartbeats, the bench's polls), per job. dead tup: n_dead_tup of \
             jobs when the drain started -> after it ended.\n\
             \x20 indexes (every jobs_done partition has the last ones): {}\n",
            layout.names.join("; "),
            ins = layout.inserted,
            done = layout.done_in_place,
            claimed = layout.claimed,
            archived = layout.archived,
        ));
        out
    }

    fn pinned_lines(&self) -> String {
        let (Some(pinned), Some(free), Some(hold)) = (
            median(&self.pinned),
            median(&self.relay),
            self.pinned_horizon,
        ) else {
            return String::new();
        };
        let ratio = pinned_ratio(pinned, free);
        let mut out = format!(
            "\npinned horizon (a REPEATABLE READ transaction on its own connection, snapshot taken with \
             SELECT count(*) FROM orders before the enqueue, held {:.1} s of a {:.1} s drain, at most {:.0} s):\n\
             \x20 relay batch {} {:.0} jobs/s pinned against {:.0} unpinned in the same run: ratio {:.2}x\n",
            pinned
                .pinned_for
                .map(|d| d.as_secs_f64())
                .unwrap_or(f64::NAN),
            pinned.seconds,
            hold.as_secs_f64(),
            pinned.batch,
            pinned.jobs_per_second(),
            free.jobs_per_second(),
            ratio,
        );
        if let (Some(p), Some(f)) = (&pinned.cost, &free.cost) {
            out.push_str(&format!(
                "  claim buffers per job (hits + reads of jobs' heap + its indexes over the drain, all \
                 statements): pinned {:.2} + {:.2}, unpinned {:.2} + {:.2}\n\
                 \x20 dead tuples in jobs (n_dead_tup) before -> after the drain: pinned {} -> {}, unpinned {} -> {}\n",
                p.heap_blks_per_job(),
                p.idx_blks_per_job(),
                f.heap_blks_per_job(),
                f.idx_blks_per_job(),
                p.dead_before,
                p.dead_after,
                f.dead_before,
                f.dead_after,
            ));
        }
        out
    }

    fn pairs(&self) -> Vec<(usize, Option<&DrainRun>, Option<&DrainRun>)> {
        let mut pairs = vec![(self.batch, median(&self.relay), median(&self.ceiling))];
        if !self.relay_batch1.is_empty() {
            pairs.push((1, median(&self.relay_batch1), median(&self.ceiling_batch1)));
        }
        pairs
    }

    pub fn table(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "\noutbox-relay bench: {} noop jobs per run, relay concurrency {}; the ceiling runs \
             concurrency / batch claim loops, so both hold as many jobs in flight\n\n",
            self.jobs, self.concurrency
        ));
        out.push_str(&format!(
            "{:<28} {:>6} {:>10} {:>8} {:>9} {:>10} {:>11} {:>9}\n",
            "run", "batch", "jobs/s", "ratio", "xact/job", "WAL B/job", "CPU s/10k", "RSS MiB"
        ));
        for (batch, relay, ceiling) in self.pairs() {
            let ceiling_rate = ceiling.map(DrainRun::jobs_per_second).unwrap_or(0.0);
            for (name, run) in [("raw SQL ceiling", ceiling), ("relay", relay)] {
                let Some(run) = run else { continue };
                let name = match run.workers {
                    Some(w) => format!("{name} ({w} loops)"),
                    None => name.to_owned(),
                };
                let ratio = if ceiling_rate > 0.0 {
                    run.jobs_per_second() / ceiling_rate
                } else {
                    f64::NAN
                };
                out.push_str(&row(&name, batch, run, Some(ratio)));
            }
        }
        if let (Some(real), Some(noop)) = (median(&self.real), median(&self.relay)) {
            out.push_str(&row("relay, real effects", real.batch, real, None));
            out.push_str(&format!(
                "\nreal effects ({} jobs: confirmation emails over SMTP and signed webhooks over HTTP, \
                 to local sinks): {:.0} jobs/s against {:.0} for noop jobs at the same batch; the relay's \
                 own machinery is about {:.0}% of a real job's time\n",
                real.jobs,
                real.jobs_per_second(),
                noop.jobs_per_second(),
                machinery_share(real, noop) * 100.0
            ));
        }
        if let Some(l) = &self.latency {
            out.push_str(&format!(
                "\nenqueue-to-start latency ({} jobs, one per transaction, idle relay, LISTEN/NOTIFY):\n  p50 {:.2} ms   p95 {:.2} ms   p99 {:.2} ms   max {:.2} ms\n",
                l.samples, l.p50_ms, l.p95_ms, l.p99_ms, l.max_ms
            ));
        }
        if let Some(loaded) = &self.latency_loaded {
            let l = &loaded.latency;
            out.push_str(&format!(
                "enqueue-to-start latency under load ({} jobs, while {} clients place orders through the API, \
                 {:.0} orders/s, {} errors; the relay also performs the orders' jobs):\n  p50 {:.2} ms   p95 {:.2} ms   p99 {:.2} ms   max {:.2} ms\n",
                l.samples, loaded.clients, loaded.orders_per_second, loaded.errors, l.p50_ms, l.p95_ms, l.p99_ms, l.max_ms
            ));
        }
        if let Some(p) = &self.placement {
            let ratio = p
                .pgbench_orders_per_second
                .map(|c| format!("{:.2}x", p.api_orders_per_second / c))
                .unwrap_or_else(|| "-".into());
            out.push_str(&format!(
                "\norder placement, {} clients: API {:.0} orders/s ({} errors), \
                 pgbench with the same inserts and no NOTIFY {} orders/s, ratio {}\n",
                p.clients,
                p.api_orders_per_second,
                p.api_errors,
                p.pgbench_orders_per_second
                    .map(|c| format!("{c:.0}"))
                    .unwrap_or_else(|| "-".into()),
                ratio
            ));
            let wal = |w: Option<f64>| w.map(|b| format!("{b:.0}")).unwrap_or_else(|| "-".into());
            out.push_str(&format!(
                "  WAL B/order (should match: the same writes): API {}, pgbench {}\n",
                wal(p.api_wal_bytes_per_order),
                wal(p.pgbench_wal_bytes_per_order),
            ));
            let l = &p.api_latency;
            out.push_str(&format!(
                "  POST /orders latency: p50 {:.2} ms   p99 {:.2} ms   ({} orders)\n",
                l.p50_ms, l.p99_ms, l.samples
            ));
            if let Some(h) = &p.half_open {
                out.push_str(&format!(
                    "  with {} half-open connections held open: {:.0} orders/s ({} errors), \
                     p50 {:.2} ms   p99 {:.2} ms   ({} orders); loaded/unloaded p50 {:.2}x, p99 {:.2}x\n",
                    h.connections,
                    h.orders_per_second,
                    h.errors,
                    h.latency.p50_ms,
                    h.latency.p99_ms,
                    h.latency.samples,
                    h.latency.p50_ms / l.p50_ms,
                    h.latency.p99_ms / l.p99_ms,
                ));
            }
        }
        out.push_str(&self.cost_table());
        out.push_str(&self.pinned_lines());
        out.push_str(
            "\nCPU s/10k: the relay process's CPU (ceiling: the bench process's own client CPU).\n",
        );
        out
    }

    pub fn json(&self) -> serde_json::Value {
        let run = |r: Option<&DrainRun>| {
            r.map(|r| {
                json!({
                    "batch": r.batch,
                    "jobs_per_second": r.jobs_per_second(),
                    "seconds": r.seconds,
                    "transactions_per_job": r.per_job(r.server.transactions),
                    "wal_bytes_per_job": r.per_job(r.server.wal_bytes),
                    "cpu_seconds_per_10k_jobs": r.cpu_per_10k(),
                    "peak_rss_mib": r.relay_peak_rss_kib.map(|k| k as f64 / 1024.0),
                    "claim_loops": r.workers,
                    "cost": r.cost.as_ref().map(cost_json),
                })
            })
        };
        let pairs: Vec<_> = self
            .pairs()
            .into_iter()
            .map(|(batch, relay, ceiling)| {
                let ratio = match (relay, ceiling) {
                    (Some(r), Some(c)) if c.jobs_per_second() > 0.0 => Some(r.jobs_per_second() / c.jobs_per_second()),
                    _ => None,
                };
                json!({ "batch": batch, "relay": run(relay), "ceiling": run(ceiling), "relay_over_ceiling": ratio })
            })
            .collect();
        json!({
            "bench": "outbox-relay",
            "jobs": self.jobs,
            "concurrency": self.concurrency,
            "drain": pairs,
            "placement": self.placement.as_ref().map(|p| json!({
                "clients": p.clients,
                "api_orders_per_second": p.api_orders_per_second,
                "api_errors": p.api_errors,
                "pgbench_orders_per_second": p.pgbench_orders_per_second,
                "api_over_pgbench": p.pgbench_orders_per_second.map(|c| p.api_orders_per_second / c),
                "api_wal_bytes_per_order": p.api_wal_bytes_per_order,
                "pgbench_wal_bytes_per_order": p.pgbench_wal_bytes_per_order,
                "latency_ms": { "p50": p.api_latency.p50_ms, "p99": p.api_latency.p99_ms, "samples": p.api_latency.samples },
                "half_open": p.half_open.as_ref().map(|h| json!({
                    "connections": h.connections,
                    "orders_per_second": h.orders_per_second,
                    "errors": h.errors,
                    "latency_ms": { "p50": h.latency.p50_ms, "p99": h.latency.p99_ms, "samples": h.latency.samples },
                    "p99_over_unloaded": h.latency.p99_ms / p.api_latency.p99_ms,
                })),
            })),
            "real_effects": median(&self.real).map(|real| json!({
                "run": run(Some(real)),
                "noop_jobs_per_second": median(&self.relay).map(DrainRun::jobs_per_second),
                "machinery_share": median(&self.relay).map(|noop| machinery_share(real, noop)),
            })),
            "latency_ms": self.latency.as_ref().map(|l| json!({
                "samples": l.samples, "p50": l.p50_ms, "p95": l.p95_ms, "p99": l.p99_ms, "max": l.max_ms
            })),
            "latency_loaded_ms": self.latency_loaded.as_ref().map(|loaded| {
                let l = &loaded.latency;
                json!({
                    "samples": l.samples, "p50": l.p50_ms, "p95": l.p95_ms, "p99": l.p99_ms, "max": l.max_ms,
                    "api_clients": loaded.clients,
                    "api_orders_per_second": loaded.orders_per_second,
                    "api_errors": loaded.errors,
                })
            }),
            "pinned_horizon": match (median(&self.pinned), median(&self.relay), self.pinned_horizon) {
                (Some(pinned), Some(free), Some(hold)) => json!({
                    "hold_at_most_seconds": hold.as_secs_f64(),
                    "held_seconds": pinned.pinned_for.map(|d| d.as_secs_f64()),
                    "pinned": run(Some(pinned)),
                    "unpinned_jobs_per_second": free.jobs_per_second(),
                    "pinned_over_unpinned": finite(pinned_ratio(pinned, free)),
                }),
                _ => serde_json::Value::Null,
            },
        })
    }
}
