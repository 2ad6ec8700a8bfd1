//! The bench's results as one JSON line.

use serde_json::json;

use super::{BenchReport, DrainRun, machinery_share, median, pinned_ratio};
use crate::bench::stats::{DbCost, finite};

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

impl BenchReport {
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
                    "server_cpu_seconds_per_10k_jobs": r.server_cpu_per_10k(),
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
                "run": "saturation",
                "clients": p.clients,
                "api_orders_per_second": p.api_orders_per_second,
                "api_errors": p.api_errors,
                "pgbench_orders_per_second": p.pgbench_orders_per_second,
                "api_over_pgbench": p.pgbench_orders_per_second.map(|c| p.api_orders_per_second / c),
                "pgbench_runs_orders_per_second": p.pgbench_runs,
                "pgbench_min_orders_per_second": p.pgbench_runs.iter().copied().reduce(f64::min),
                "pgbench_max_orders_per_second": p.pgbench_runs.iter().copied().reduce(f64::max),
                "api_wal_bytes_per_order": p.api_wal_bytes_per_order,
                "cpu_us_per_order": {
                    "api_server": p.api_cpu.server_us,
                    "api_client": p.api_cpu.client_us,
                    "pgbench_server": p.pgbench_cpu.server_us,
                    "pgbench_client": p.pgbench_cpu.client_us,
                    "http_floor_client": p.http_floor.as_ref().and_then(|f| f.client_us),
                },
                "http_floor_orders_per_second": p.http_floor.as_ref().map(|f| f.orders_per_second),
                "auth_cost": {
                    "with_keys_orders_per_second": p.auth_cost.with_keys_orders_per_second,
                    "without_orders_per_second": p.auth_cost.without_orders_per_second,
                    "with_keys_errors": p.auth_cost.with_keys_errors,
                    "without_errors": p.auth_cost.without_errors,
                    "with_keys_over_without": finite(p.auth_cost.ratio()),
                },
                "window_cost": {
                    "payment_window": "30m",
                    "with_window_orders_per_second": p.window_cost.with_window_orders_per_second,
                    "without_orders_per_second": p.window_cost.without_orders_per_second,
                    "with_window_errors": p.window_cost.with_window_errors,
                    "without_errors": p.window_cost.without_errors,
                    "with_window_over_without": finite(p.window_cost.ratio()),
                },
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
            "open_loop": self.open_loop_json(),
            "open_loop_worst_p99": self.open_loop_worst_json(),
            "growth": self.growth.as_ref().map(super::super::growth::Growth::json),
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
            "baseline": match (median(&self.baseline), median(&self.relay), &self.baseline_relay) {
                (Some(baseline), Some(relay), Some(exe)) => json!({
                    "binary": exe.display().to_string(),
                    "baseline": run(Some(baseline)),
                    "relay_jobs_per_second": relay.jobs_per_second(),
                    "relay_over_baseline": finite(pinned_ratio(relay, baseline)),
                }),
                _ => serde_json::Value::Null,
            },
            "defaults": match (median(&self.defaults), median(&self.relay)) {
                (Some(defaults), Some(relay)) => json!({
                    "defaults": run(Some(defaults)),
                    "relay_jobs_per_second": relay.jobs_per_second(),
                    "defaults_over_relay": finite(pinned_ratio(defaults, relay)),
                    "per_round": self.defaults.iter().zip(&self.relay)
                        .map(|(d, r)| finite(pinned_ratio(d, r))).collect::<Vec<_>>(),
                }),
                _ => serde_json::Value::Null,
            },
            "concurrency_keys": match (median(&self.keyed), median(&self.relay), self.concurrency_keys) {
                (Some(keyed), Some(free), Some(keys)) => json!({
                    "keys": keys,
                    "keyed": run(Some(keyed)),
                    "keyless_jobs_per_second": free.jobs_per_second(),
                    "keyed_over_keyless": finite(pinned_ratio(keyed, free)),
                }),
                _ => serde_json::Value::Null,
            },
        })
    }
}
