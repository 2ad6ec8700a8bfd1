//! The open-loop runs in the table and in the JSON line.

use serde_json::json;

use super::BenchReport;
use crate::bench::ArrivalRate;
use crate::bench::open_loop::{DRAIN_LIMIT, MAX_IN_FLIGHT, OpenLoopRun};
use crate::bench::stats::finite;

/// The depth at each whole second: the most of that second's samples.
fn depth_per_second(run: &OpenLoopRun) -> Vec<i64> {
    let mut seconds: Vec<i64> = Vec::new();
    for sample in &run.depth {
        let second = sample.at.max(0.0) as usize;
        if seconds.len() <= second {
            seconds.resize(second + 1, 0);
        }
        seconds[second] = seconds[second].max(sample.pending + sample.processing);
    }
    seconds
}

impl BenchReport {
    /// The saturation run's orders per second, which shares resolve against.
    fn saturation(&self) -> Option<f64> {
        self.placement.as_ref().map(|p| p.api_orders_per_second)
    }

    pub(super) fn open_loop_lines(&self) -> String {
        if self.open_loop.is_empty() {
            return String::new();
        }
        let mut out = format!(
            "\nopen loop: orders sent through the API on a fixed schedule, each request started at its \
             slot whether or not earlier ones were answered; a relay at concurrency {}, \
             batch {} in this process runs every order job as a no-op; enqueue-to-start from each \
             job's created_at (its transaction's start) to the executor starting it; depth = pending \
             + processing every 250 ms, bounded when it grew by under 2% of the jobs' arrival rate \
             from the first third of the run to the last:\n\
             {:<16} {:>3} {:>8} {:>8} {:>6} {:>5} {:>8} {:>7} {:>8} {:>8} {:>7} {:>9}  {:<8} {:>9} {:>9} {:>4} {:>4}\n",
            self.concurrency,
            self.batch,
            "rate",
            "run",
            "target/s",
            "placed/s",
            "errors",
            "late",
            "POST p99",
            "jobs/s",
            "e2s p50",
            "e2s p99",
            "max dep",
            "growth/s",
            "depth",
            "late p99",
            "late max",
            "ckpt",
            "av"
        );
        for run in &self.open_loop {
            let rate = match (run.requested, self.saturation()) {
                (ArrivalRate::Share(_), Some(max)) => format!("{} of {max:.0}", run.requested),
                _ => run.requested.to_string(),
            };
            let (max, growth, verdict) = match &run.depth_summary {
                Some(d) => (
                    d.max.to_string(),
                    format!("{:.1}", d.growth_per_second),
                    if d.bounded { "bounded" } else { "GROWING" },
                ),
                None => ("-".into(), "-".into(), "-"),
            };
            out.push_str(&format!(
                "{:<16} {:>3} {:>8.0} {:>8.0} {:>6} {:>5} {:>8.2} {:>7.0} {:>8.2} {:>8.2} {:>7} {:>9}  {:<8} {:>9.2} {:>9.2} {:>4} {:>4}\n",
                rate,
                run.round,
                run.target_per_second,
                run.achieved_per_second(),
                run.errors() + run.unanswered,
                run.late_sends,
                run.post_latency.p99_ms,
                run.jobs_per_second(),
                run.enqueue_to_start.p50_ms,
                run.enqueue_to_start.p99_ms,
                max,
                growth,
                verdict,
                run.send_lateness.p99_ms,
                run.send_lateness.max_ms,
                run.background.checkpoints,
                run.background.jobs_autovacuums + run.background.jobs_autoanalyzes,
            ));
        }
        for (rate, worst) in self.worst_open_loop_p99() {
            out.push_str(&format!(
                "  {rate}: worst enqueue-to-start p99 of its runs {:.2} ms (run {})\n",
                worst.enqueue_to_start.p99_ms, worst.round
            ));
        }
        for run in &self.open_loop {
            let depths: Vec<String> = depth_per_second(run)
                .iter()
                .map(ToString::to_string)
                .collect();
            out.push_str(&format!(
                "  {} run {}: depth each second (the most of its samples): {}",
                run.requested,
                run.round,
                depths.join(" ")
            ));
            if let Some(phases) = &run.phases {
                out.push_str(&format!("; {}", phases.line()));
            }
            if run.errors() > 0 {
                let statuses: Vec<String> = run
                    .statuses
                    .iter()
                    .map(|(status, n)| format!("{n} answered {status}"))
                    .collect();
                out.push_str(&format!(
                    "; errors: {} not sent ({} requests already in flight), {} with no answer{}{}",
                    run.refused,
                    MAX_IN_FLIGHT,
                    run.failed,
                    if statuses.is_empty() { "" } else { ", " },
                    statuses.join(", ")
                ));
            }
            if run.unstarted > 0 {
                out.push_str(&format!(
                    "; {} of {} jobs not started {} s after the orders stopped: the latencies read low",
                    run.unstarted,
                    run.jobs,
                    DRAIN_LIMIT.as_secs()
                ));
            }
            out.push('\n');
        }
        out.push_str(&format!(
            "  errors: non-201 answers, failed requests, requests unanswered 5 s after the run, and slots \
             skipped because {} requests were in flight (each run's line above splits them); late: \
             requests sent over 10 ms after their slot (the load generator, on a thread of its own, starved \
             of CPU); late p99 / max: each send's delay after its slot, in ms; ckpt: checkpoints during the \
             run; av: autovacuum and autoanalyze passes over jobs during the run. POST p99 and e2s in ms.\n",
            MAX_IN_FLIGHT
        ));
        out
    }

    /// Per rate, in the order given, its run with the highest
    /// enqueue-to-start p99 (only rates run more than once).
    pub(crate) fn worst_open_loop_p99(&self) -> Vec<(String, &OpenLoopRun)> {
        let mut worst: Vec<(String, &OpenLoopRun, usize)> = Vec::new();
        for run in &self.open_loop {
            let rate = run.requested.to_string();
            match worst.iter_mut().find(|(r, _, _)| *r == rate) {
                Some(entry) => {
                    entry.2 += 1;
                    if run.enqueue_to_start.p99_ms > entry.1.enqueue_to_start.p99_ms {
                        entry.1 = run;
                    }
                }
                None => worst.push((rate, run, 1)),
            }
        }
        worst
            .into_iter()
            .filter(|(_, _, runs)| *runs > 1)
            .map(|(rate, run, _)| (rate, run))
            .collect()
    }

    pub(super) fn open_loop_worst_json(&self) -> serde_json::Value {
        self.worst_open_loop_p99()
            .into_iter()
            .map(|(rate, run)| {
                json!({
                    "rate": rate,
                    "run": run.round,
                    "enqueue_to_start_p99_ms": finite(run.enqueue_to_start.p99_ms),
                })
            })
            .collect()
    }

    pub(super) fn open_loop_json(&self) -> serde_json::Value {
        let saturation = self.saturation();
        self.open_loop
            .iter()
            .map(|run| {
                let l = &run.enqueue_to_start;
                json!({
                    "rate": run.requested.to_string(),
                    "run": run.round,
                    "send_lateness_ms": {
                        "p50": finite(run.send_lateness.p50_ms),
                        "p99": finite(run.send_lateness.p99_ms),
                        "max": finite(run.send_lateness.max_ms),
                    },
                    "background": {
                        "checkpoints": run.background.checkpoints,
                        "checkpoint_buffers": run.background.checkpoint_buffers,
                        "jobs_autovacuums": run.background.jobs_autovacuums,
                        "jobs_autoanalyzes": run.background.jobs_autoanalyzes,
                    },
                    "share_of_saturation": match run.requested {
                        ArrivalRate::Share(share) => Some(share),
                        ArrivalRate::PerSecond(_) => None,
                    },
                    "saturation_orders_per_second": saturation,
                    "target_orders_per_second": run.target_per_second,
                    "achieved_orders_per_second": run.achieved_per_second(),
                    "seconds": run.seconds,
                    "sent": run.sent,
                    "placed": run.placed,
                    "placed_in_time": run.placed_in_time,
                    "errors": run.errors(),
                    "refused": run.refused,
                    "failed": run.failed,
                    "statuses": run.statuses,
                    "unanswered": run.unanswered,
                    "late_sends": run.late_sends,
                    "post_latency_ms": { "p50": finite(run.post_latency.p50_ms), "p99": finite(run.post_latency.p99_ms) },
                    "relay": { "concurrency": self.concurrency, "batch": self.batch, "executor": "noop" },
                    "jobs": run.jobs,
                    "jobs_per_second": run.jobs_per_second(),
                    "unstarted_jobs": run.unstarted,
                    "enqueue_to_start_ms": {
                        "samples": l.samples, "p50": finite(l.p50_ms), "p95": finite(l.p95_ms),
                        "p99": finite(l.p99_ms), "max": finite(l.max_ms),
                    },
                    "depth": run.depth_summary.as_ref().map(|d| json!({
                        "samples": d.samples,
                        "max": d.max,
                        "first_third_mean": d.first_third_mean,
                        "last_third_mean": d.last_third_mean,
                        "growth_jobs_per_second": d.growth_per_second,
                        "bounded": d.bounded,
                        "series": run.depth.iter().map(|s| json!([
                            (s.at * 1000.0).round() / 1000.0, s.pending, s.processing
                        ])).collect::<Vec<_>>(),
                    })),
                    "phases": run.phases.as_ref().map(|p| json!({
                        "from_claimable_ms": {
                            "p50": finite(p.from_claimable.p50_ms), "p99": finite(p.from_claimable.p99_ms)
                        },
                        "to_claim_ms": { "p50": finite(p.to_claim.p50_ms), "p99": finite(p.to_claim.p99_ms) },
                        "claim_to_start_ms": {
                            "p50": finite(p.claim_to_start.p50_ms), "p99": finite(p.claim_to_start.p99_ms)
                        },
                        "tail_jobs": p.tail_jobs,
                        "tail_kinds": p.tail_kinds.iter().map(|(k, n)| json!([k, n])).collect::<Vec<_>>(),
                        "tail_to_claim_ms": finite(p.tail_to_claim_ms),
                        "tail_claim_to_start_ms": finite(p.tail_claim_to_start_ms),
                        "tail_slots": p.tail_slots,
                        "run_slots": p.run_slots,
                        "waits": p.waits.iter().map(|(w, n)| json!([w, n])).collect::<Vec<_>>(),
                        "idle_in_transaction": p.idle_in_transaction,
                    })),
                })
            })
            .collect()
    }
}
