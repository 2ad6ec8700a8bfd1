//! How the bench's results read as a table: the drains, the latencies, the
//! placement, the database's cost per job and the pinned horizon.

use super::{BenchReport, DrainRun, machinery_share, median, pinned_ratio};

/// One line of the drain table; `ratio` against the ceiling, when there is one.
fn row(name: &str, batch: usize, run: &DrainRun, ratio: Option<f64>) -> String {
    let or_dash = |value: Option<String>| value.unwrap_or_else(|| "-".into());
    format!(
        "{:<28} {:>6} {:>10.0} {:>8} {:>9.2} {:>10.0} {:>11} {:>10} {:>9}\n",
        name,
        batch,
        run.jobs_per_second(),
        or_dash(ratio.map(|r| format!("{r:.2}x"))),
        run.per_job(run.server.transactions),
        run.per_job(run.server.wal_bytes),
        or_dash(run.cpu_per_10k().map(|c| format!("{c:.2}"))),
        or_dash(run.server_cpu_per_10k().map(|c| format!("{c:.2}"))),
        or_dash(
            run.relay_peak_rss_kib
                .map(|k| format!("{:.1}", k as f64 / 1024.0))
        ),
    )
}

impl BenchReport {
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

    fn keyed_lines(&self) -> String {
        let (Some(keyed), Some(free), Some(keys)) = (
            median(&self.keyed),
            median(&self.relay),
            self.concurrency_keys,
        ) else {
            return String::new();
        };
        format!(
            "\nconcurrency keys (the noop jobs spread over {keys} keys without limits):\n\
             \x20 relay batch {} {:.0} jobs/s keyed against {:.0} keyless in the same run: ratio {:.2}x\n",
            keyed.batch,
            keyed.jobs_per_second(),
            free.jobs_per_second(),
            pinned_ratio(keyed, free),
        )
    }

    fn baseline_lines(&self) -> String {
        let (Some(baseline), Some(relay), Some(exe)) = (
            median(&self.baseline),
            median(&self.relay),
            self.baseline_relay.as_ref(),
        ) else {
            return String::new();
        };
        format!(
            "\nbefore and after (the same drain by the baseline build {}):\n\
             \x20 relay batch {} {:.0} jobs/s against the baseline's {:.0} in the same run: ratio {:.2}x\n",
            exe.display(),
            relay.batch,
            relay.jobs_per_second(),
            baseline.jobs_per_second(),
            pinned_ratio(relay, baseline),
        )
    }

    fn defaults_lines(&self) -> String {
        let (Some(defaults), Some(relay)) = (median(&self.defaults), median(&self.relay)) else {
            return String::new();
        };
        let rounds: Vec<String> = self
            .defaults
            .iter()
            .zip(&self.relay)
            .map(|(d, r)| format!("{:.2}", pinned_ratio(d, r)))
            .collect();
        format!(
            "\nthe defaults against concurrency {} / batch {} (drained in the same rounds):\n\
             \x20 concurrency {} / batch {} {:.0} jobs/s against {:.0}: ratio {:.2}x (per round {})\n",
            self.concurrency,
            relay.batch,
            order_service::worker_pool::DEFAULT_CONCURRENCY,
            defaults.batch,
            defaults.jobs_per_second(),
            relay.jobs_per_second(),
            pinned_ratio(defaults, relay),
            rounds.join(", "),
        )
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

    pub fn table(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "\noutbox-relay bench: {} noop jobs per run, relay concurrency {}; the ceiling runs \
             concurrency / batch claim loops, so both hold as many jobs in flight\n\n",
            self.jobs, self.concurrency
        ));
        out.push_str(&format!(
            "{:<28} {:>6} {:>10} {:>8} {:>9} {:>10} {:>11} {:>10} {:>9}\n",
            "run",
            "batch",
            "jobs/s",
            "ratio",
            "xact/job",
            "WAL B/job",
            "CPU s/10k",
            "PG s/10k",
            "RSS MiB"
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
            let spread = match (
                p.pgbench_runs.iter().copied().reduce(f64::min),
                p.pgbench_runs.iter().copied().reduce(f64::max),
            ) {
                (Some(min), Some(max)) => format!(
                    " (median of {} runs before, between and after the API's; spread {min:.0} to {max:.0}, \
                     API / each run {})",
                    p.pgbench_runs.len(),
                    p.pgbench_runs
                        .iter()
                        .map(|c| format!("{:.2}x", p.api_orders_per_second / c))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                _ => String::new(),
            };
            out.push_str(&format!(
                "\norder placement, saturation (closed loop: {} clients flat out): API {:.0} orders/s ({} errors), \
                 pgbench with the same inserts and no NOTIFY {} orders/s{}, ratio {}\n",
                p.clients,
                p.api_orders_per_second,
                p.api_errors,
                p.pgbench_orders_per_second
                    .map(|c| format!("{c:.0}"))
                    .unwrap_or_else(|| "-".into()),
                spread,
                ratio
            ));
            let wal = |w: Option<f64>| w.map(|b| format!("{b:.0}")).unwrap_or_else(|| "-".into());
            out.push_str(&format!(
                "  WAL B/order (should match: the same writes): API {}, pgbench {}\n",
                wal(p.api_wal_bytes_per_order),
                wal(p.pgbench_wal_bytes_per_order),
            ));
            let us = |u: Option<f64>| u.map(|u| format!("{u:.0}")).unwrap_or_else(|| "-".into());
            out.push_str(&format!(
                "  CPU us/order: server API {} pgbench {}; client side API and its load generator {}, pgbench {}\n",
                us(p.api_cpu.server_us),
                us(p.pgbench_cpu.server_us),
                us(p.api_cpu.client_us),
                us(p.pgbench_cpu.client_us),
            ));
            if let Some(floor) = &p.http_floor {
                out.push_str(&format!(
                    "  HTTP alone (the same load generator against a server answering 201 without work): \
                     {:.0} orders/s, {} us/order in this process\n",
                    floor.orders_per_second,
                    us(floor.client_us),
                ));
            }
            let a = &p.auth_cost;
            out.push_str(&format!(
                "  what API keys cost placement (same database, alternating runs): with keys {:.0} orders/s \
                 ({} errors), with API_AUTH=none {:.0} orders/s ({} errors), ratio {:.2}x\n",
                a.with_keys_orders_per_second,
                a.with_keys_errors,
                a.without_orders_per_second,
                a.without_errors,
                a.ratio(),
            ));
            let w = &p.window_cost;
            out.push_str(&format!(
                "  placement with a payment window (ORDER_PAYMENT_WINDOW=30m, same database, alternating \
                 runs): {:.0} orders/s ({} errors), without {:.0} orders/s ({} errors), ratio {:.2}x\n",
                w.with_window_orders_per_second,
                w.with_window_errors,
                w.without_orders_per_second,
                w.without_errors,
                w.ratio(),
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
        out.push_str(&self.open_loop_lines());
        if let Some(growth) = &self.growth {
            out.push_str(&growth.lines());
        }
        out.push_str(&self.cost_table());
        out.push_str(&self.pinned_lines());
        out.push_str(&self.keyed_lines());
        out.push_str(&self.baseline_lines());
        out.push_str(&self.defaults_lines());
        out.push_str(
            "\nCPU s/10k: the relay process's CPU (ceiling: the bench process's own client CPU). \
             PG s/10k: every PostgreSQL process's CPU on this machine over the same drain.\n",
        );
        out
    }
}
