//! `outbox-relay bench` runs end to end on a tiny workload and prints its JSON line.

use std::process::Command;

#[test]
fn bench_runs_a_small_workload_and_reports_every_figure() {
    // Its open loop bounds a time: half the rate the API placed moments
    // before, through one pooled connection, must be answered within the
    // API's two-second wait for that connection, or the run counts errors.
    // Beside another heavy test on two cores the API's rate can fall under
    // that half (a CI run counted 82 errors), so no other heavy test runs
    // beside it.
    let _heavy = crate::support::seats::heavy();
    let _seat = crate::support::seats::scratch(70);
    let child = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args([
            "bench",
            "--jobs",
            "300",
            "--latency-samples",
            "20",
            "--api-clients",
            "1",
            "--api-duration",
            "300ms",
            "--half-open",
            "200",
            "--effects",
            "real",
            "--real-jobs",
            "200",
            "--pinned-horizon",
            "30s",
            "--arrival-rate",
            "50%,20",
            "--open-loop-duration",
            "1s",
        ])
        .env("DATABASE_URL", crate::support::db::admin_url())
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run bench");
    let pid = child.id();
    let output = child.wait_with_output().expect("bench output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench failed:\n{stdout}\n{stderr}");

    let json_line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .expect("a JSON line");
    let report: serde_json::Value = serde_json::from_str(json_line).expect("valid JSON");
    let drain = report["drain"].as_array().expect("drain runs");
    assert_eq!(drain.len(), 2, "default batch and batch 1: {report}");
    for run in drain {
        for side in ["relay", "ceiling"] {
            assert!(
                run[side]["jobs_per_second"]
                    .as_f64()
                    .is_some_and(|r| r > 0.0),
                "{side}: {run}"
            );
            assert!(
                run[side]["transactions_per_job"]
                    .as_f64()
                    .is_some_and(|t| t > 0.0),
                "{side}: {run}"
            );
        }
        assert!(
            run["relay"]["peak_rss_mib"]
                .as_f64()
                .is_some_and(|m| m > 1.0),
            "{run}"
        );
        assert!(run["relay_over_ceiling"].as_f64().is_some(), "{run}");
        for side in ["relay", "ceiling"] {
            assert_sane_cost(&run[side]["cost"], side);
        }
    }
    // The ceiling moves every done job to jobs_done, and its claim is a HOT
    // update: an enqueued job's entries (the key and the two claim indexes)
    // are all it writes, give or take a claim that found no room on its page.
    let ceiling = &drain[0]["ceiling"]["cost"];
    assert_eq!(ceiling["jobs_deletes"], 300, "{ceiling}");
    assert_eq!(ceiling["jobs_done_inserts"], 300, "{ceiling}");
    assert!(
        ceiling["index_entries_per_job"]
            .as_f64()
            .is_some_and(|n| (3.0..=5.0).contains(&n)),
        "{ceiling}"
    );
    // The pinned drain ran next to the unpinned one and is set against it.
    let pinned = &report["pinned_horizon"];
    assert!(
        pinned["pinned_over_unpinned"]
            .as_f64()
            .is_some_and(|r| r > 0.0),
        "{pinned}"
    );
    assert!(
        pinned["held_seconds"].as_f64().is_some_and(|s| s > 0.0),
        "{pinned}"
    );
    assert_sane_cost(&pinned["pinned"]["cost"], "pinned");
    assert!(
        stdout.contains("per-job database cost") && stdout.contains("pinned horizon ("),
        "{stdout}"
    );
    // Every email and webhook reached its sink (the bench checks), and the
    // run is set against the noop drain.
    let real = &report["real_effects"];
    assert!(
        real["run"]["jobs_per_second"]
            .as_f64()
            .is_some_and(|r| r > 0.0),
        "{report}"
    );
    assert!(
        real["machinery_share"].as_f64().is_some_and(|s| s > 0.0),
        "{report}"
    );
    assert!(stdout.contains("relay, real effects"), "{stdout}");
    assert_eq!(report["latency_ms"]["samples"], 20);
    // Latency again, while the API takes orders.
    let loaded = &report["latency_loaded_ms"];
    assert_eq!(loaded["samples"], 20, "{loaded}");
    assert!(loaded["p99"].as_f64().is_some_and(|p| p > 0.0), "{loaded}");
    assert!(
        loaded["api_orders_per_second"]
            .as_f64()
            .is_some_and(|r| r > 0.0),
        "{loaded}"
    );
    assert_eq!(loaded["api_errors"], 0, "{loaded}");
    assert!(stdout.contains("latency under load"), "{stdout}");
    assert!(
        report["latency_ms"]["p50"]
            .as_f64()
            .is_some_and(|p| p > 0.0)
    );
    assert!(
        report["placement"]["api_orders_per_second"]
            .as_f64()
            .is_some_and(|r| r > 0.0)
    );
    assert_eq!(report["placement"]["api_errors"], 0);
    assert!(
        report["placement"]["api_wal_bytes_per_order"]
            .as_f64()
            .is_some_and(|b| b > 0.0),
        "{report}"
    );
    // pgbench writes what the API writes (it may be missing: no pgbench).
    if report["placement"]["pgbench_orders_per_second"].is_number() {
        assert_pgbench_runs_around_the_api(&report);
        assert!(
            report["placement"]["pgbench_wal_bytes_per_order"]
                .as_f64()
                .is_some_and(|b| b > 0.0),
            "{report}"
        );
    } else {
        crate::support::optional_tool_missing(
            "pgbench (the placement's ceiling was not measured; the bench said why on stderr)",
            "Debian: apt-get install postgresql, whose server package ships it",
        );
    }
    // POST /orders latency, alone and with half-open connections held open.
    let placement = &report["placement"];
    assert!(
        placement["latency_ms"]["p99"]
            .as_f64()
            .is_some_and(|p| p > 0.0),
        "{placement}"
    );
    // What API keys cost placement: both sides ran, without errors.
    let auth = &placement["auth_cost"];
    assert_eq!(auth["with_keys_errors"], 0, "{auth}");
    assert_eq!(auth["without_errors"], 0, "{auth}");
    assert!(
        auth["with_keys_over_without"]
            .as_f64()
            .is_some_and(|r| r > 0.0),
        "{auth}"
    );
    // What a payment window costs placement: both sides ran, without errors.
    let window = &placement["window_cost"];
    assert_eq!(window["payment_window"], "30m", "{window}");
    assert_eq!(window["with_window_errors"], 0, "{window}");
    assert_eq!(window["without_errors"], 0, "{window}");
    assert!(
        window["with_window_over_without"]
            .as_f64()
            .is_some_and(|r| r > 0.0),
        "{window}"
    );
    assert!(
        stdout.contains("placement with a payment window (ORDER_PAYMENT_WINDOW=30m"),
        "{stdout}"
    );
    assert_eq!(placement["half_open"]["connections"], 200, "{placement}");
    assert_eq!(placement["half_open"]["errors"], 0, "{placement}");
    assert!(
        placement["half_open"]["p99_over_unloaded"]
            .as_f64()
            .is_some_and(|r| r > 0.0),
        "{placement}"
    );
    assert!(
        stdout.contains("raw SQL ceiling") && stdout.contains("enqueue-to-start latency"),
        "{stdout}"
    );
    assert_sane_open_loop(&report);
    assert!(
        stdout.contains("order placement, saturation") && stdout.contains("open loop: orders sent"),
        "{stdout}"
    );
    assert_publish_floor(&stderr, 200);
    // The scratch database (named after the bench's pid) is gone.
    use diesel::RunQueryDsl as _;
    #[derive(diesel::QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let mut conn =
        <diesel::PgConnection as diesel::Connection>::establish(&crate::support::db::admin_url())
            .expect("connect");
    let left: N = diesel::sql_query(format!(
        "SELECT count(*) AS n FROM pg_database WHERE datname LIKE 'outbox\\_bench\\_{pid}\\_%'"
    ))
    .get_result(&mut conn)
    .expect("count");
    assert_eq!(left.n, 0, "the scratch database was left behind");
}

/// The publish drain's line (where a NATS server answered) has its replay
/// of the contract's writes: every publish job's two rows and no other job's
/// (the webhook and email drain before it wrote rows to the same tables),
/// and a bound with them that is a share of the bound without them; its
/// reads made again, each bound with more added a share of the one without;
/// and a relay CPU floor that is the sum of its two parts.
fn assert_publish_floor(stderr: &str, publish_jobs: usize) {
    let Some(line) = stderr
        .lines()
        .find(|l| l.contains("relay (NATS publishes)"))
    else {
        assert!(stderr.contains("publish drain: SKIPPED"), "{stderr}");
        return;
    };
    assert_publish_line(line, publish_jobs);
}

/// One publish drain's summary line: see [`assert_publish_floor`].
fn assert_publish_line(line: &str, publish_jobs: usize) {
    // Each figure is the number right after its marker, read in the line's
    // order from the replay on.
    let mut rest = line
        .split_once("written again alone (")
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| panic!("the replay in {line}"));
    let mut next = |marker: &str| -> f64 {
        let (_, tail) = rest
            .split_once(marker)
            .unwrap_or_else(|| panic!("{marker:?} in {line}"));
        rest = tail;
        tail.split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a number after {marker:?} in {line}"))
    };
    let jobs = next("");
    let writes_per_second = next("connections): ");
    let bound_with_writes = next("bound with them ");
    let share = next("jobs/s, ");
    let share_with_attempts = next("with the attempt row alone ");
    let read_pairs = next("made again alone (");
    let reads_per_second = next("a statement): ");
    let events_per_second = next("the events alone by key ");
    let share_with_read = next("bound with the two rows and the read ");
    let share_with_event = next("with the two rows and the event by key ");
    let raw_cpu = next("raw loop's own CPU ");
    let noop_cpu = next("noop twin ");
    let cpu_floor = next("+ raw) ");
    assert_eq!(jobs as usize, publish_jobs, "{line}");
    assert!(writes_per_second > 0.0 && bound_with_writes > 0.0, "{line}");
    // The replay reads in the relay's batches, and says how many.
    assert_eq!(
        read_pairs as usize,
        order_service::effects::nats::loader::MAX_PAIRS_PER_READ,
        "{line}"
    );
    assert!(reads_per_second > 0.0 && events_per_second > 0.0, "{line}");
    // Any cost added to a job leaves a share of the bound without it.
    for share in [share, share_with_attempts] {
        assert!(share > 0.0 && share <= 1.0, "{line}");
    }
    for more in [share_with_read, share_with_event] {
        assert!(more > 0.0 && more <= share, "{line}");
    }
    // Read in the kernel's ticks (10 ms): a tiny run's may be none.
    assert!(raw_cpu >= 0.0 && noop_cpu >= 0.0, "{line}");
    // Rounded to a tenth each, as printed.
    assert!((cpu_floor - (raw_cpu + noop_cpu)).abs() <= 0.15, "{line}");
}

/// pgbench ran before, between and after the API's runs; the figure the API
/// is set against is their median, inside their spread.
fn assert_pgbench_runs_around_the_api(report: &serde_json::Value) {
    let placement = &report["placement"];
    let runs: Vec<f64> = placement["pgbench_runs_orders_per_second"]
        .as_array()
        .expect("pgbench's runs")
        .iter()
        .filter_map(serde_json::Value::as_f64)
        .collect();
    assert_eq!(runs.len(), 3, "{placement}");
    assert!(runs.iter().all(|r| *r > 0.0), "{placement}");
    let median = placement["pgbench_orders_per_second"]
        .as_f64()
        .expect("the median");
    let (min, max) = (
        placement["pgbench_min_orders_per_second"]
            .as_f64()
            .expect("min"),
        placement["pgbench_max_orders_per_second"]
            .as_f64()
            .expect("max"),
    );
    assert!(min <= median && median <= max, "{placement}");
    assert!(runs.contains(&median), "{placement}");
}

/// The open-loop rows: one per rate, in the order given, the share resolved
/// against the saturation run; every order placed and every job started,
/// with latencies and a depth series that are numbers.
fn assert_sane_open_loop(report: &serde_json::Value) {
    let runs = report["open_loop"].as_array().expect("open-loop runs");
    assert_eq!(runs.len(), 2, "{report}");
    let saturation = report["placement"]["api_orders_per_second"]
        .as_f64()
        .expect("a saturation rate");
    let target = |run: &serde_json::Value| run["target_orders_per_second"].as_f64();
    assert!(
        target(&runs[0]).is_some_and(|t| (t - saturation / 2.0).abs() < 1e-6),
        "{report}"
    );
    assert_eq!(runs[0]["rate"], "50%");
    assert_eq!(target(&runs[1]), Some(20.0), "{report}");
    for run in runs {
        let wanted = target(run).unwrap_or(0.0);
        assert!(
            run["achieved_orders_per_second"]
                .as_f64()
                .is_some_and(|r| r > 0.0 && r <= wanted * 1.05 + 1.0),
            "{run}"
        );
        assert_eq!(run["errors"], 0, "{run}");
        assert_eq!(run["unanswered"], 0, "{run}");
        assert_eq!(run["placed"], run["sent"], "{run}");
        let (placed, jobs) = (
            run["placed"].as_i64().unwrap_or(0),
            run["jobs"].as_i64().unwrap_or(0),
        );
        assert!(placed > 0 && jobs >= 2 * placed, "{run}");
        assert_eq!(run["unstarted_jobs"], 0, "{run}");
        let latency = &run["enqueue_to_start_ms"];
        assert_eq!(latency["samples"].as_i64(), Some(jobs), "{run}");
        let (p50, p99) = (latency["p50"].as_f64(), latency["p99"].as_f64());
        assert!(
            p50.zip(p99)
                .is_some_and(|(p50, p99)| p50 >= 0.0 && p99 >= p50),
            "{run}"
        );
        let depth = &run["depth"];
        assert!(depth["samples"].as_u64().is_some_and(|n| n >= 3), "{run}");
        assert!(depth["bounded"].is_boolean(), "{run}");
        assert!(depth["max"].as_i64().is_some_and(|m| m >= 0), "{run}");
        assert!(depth["growth_jobs_per_second"].is_number(), "{run}");
    }
}

/// Rates the open loop cannot run are refused before anything starts, each
/// error naming the flag and the value.
#[test]
fn bench_refuses_an_arrival_rate_it_cannot_run_naming_the_value() {
    for bad in ["0", "abc", "150%", "-5", "50%,-1%"] {
        let output = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
            .args(["bench", "--arrival-rate", bad])
            .env("DATABASE_URL", crate::support::db::admin_url())
            .output()
            .expect("run bench");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{bad}: {stderr}");
        let value = bad.rsplit(',').next().unwrap_or(bad);
        assert!(
            stderr.contains("--arrival-rate") && stderr.contains(&format!("'{value}'")),
            "{bad}: {stderr}"
        );
    }
}

/// A drain's cost line carries real numbers: WAL written, index entries in
/// the range a bench job can cost, a share that is a share.
fn assert_sane_cost(cost: &serde_json::Value, side: &str) {
    for key in ["wal_bytes_per_job_enqueue", "wal_bytes_per_job_drain"] {
        assert!(
            cost[key].as_f64().is_some_and(|b| b > 0.0),
            "{side} {key}: {cost}"
        );
    }
    let entries = cost["index_entries_per_job"].as_f64();
    assert!(
        entries.is_some_and(|n| (1.0..=12.0).contains(&n)),
        "{side}: {cost}"
    );
    // Where the WAL could be read, it agrees with the formula.
    if let (Some(estimate), Some(counted)) =
        (entries, cost["index_entries_per_job_from_wal"].as_f64())
    {
        assert!((estimate - counted).abs() <= 0.5, "{side}: {cost}");
    }
    assert!(
        cost["hot_update_share"]
            .as_f64()
            .is_some_and(|s| (0.0..=1.0).contains(&s)),
        "{side}: {cost}"
    );
    assert!(
        cost["heap_buffers_per_job"]
            .as_f64()
            .is_some_and(|b| b > 0.0),
        "{side}: {cost}"
    );
    assert!(cost["dead_tuples_after"].is_i64(), "{side}: {cost}");
}

/// `bench --endpoints` on a small run: both latencies measured, their ratio
/// reported, and the slow receiver never had more calls open than its
/// endpoint's max_in_flight.
#[test]
fn bench_endpoints_reports_the_healthy_latency_beside_a_slow_endpoint_and_its_open_calls() {
    // Not a heavy test: it bounds no time (its calls open are counted), and
    // it spends most of its 11 s waiting on a receiver that answers in 2 s.
    let _seat = crate::support::seats::scratch(70);
    let output = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args([
            "bench",
            "--endpoints",
            "--slow-answer",
            "2s",
            "--endpoint-orders",
            "100",
        ])
        .env("DATABASE_URL", crate::support::db::admin_url())
        .env_remove("RUST_LOG")
        .output()
        .expect("run bench --endpoints");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench failed:\n{stdout}\n{stderr}");
    let json_line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .expect("a JSON line");
    let report: serde_json::Value = serde_json::from_str(json_line).expect("valid JSON");
    let run = &report["endpoints"];
    for side in ["fast_alone", "fast_beside_slow"] {
        assert_eq!(run[side]["samples"], 100, "{side}: {run}");
        assert!(
            run[side]["p99_ms"].as_f64().is_some_and(|p| p > 0.0),
            "{side}: {run}"
        );
    }
    assert!(run["p99_ratio"].as_f64().is_some_and(|r| r > 0.0), "{run}");
    let (calls, most_open) = (
        run["slow_calls"].as_u64().unwrap_or(0),
        run["slow_most_open"].as_u64().unwrap_or(u64::MAX),
    );
    assert!(calls >= 4, "the slow endpoint was called: {run}");
    assert!(
        (1..=4).contains(&most_open) && run["slow_max_in_flight"] == 4,
        "never more calls open than max_in_flight: {run}"
    );
    assert!(stdout.contains("beside / alone"), "{stdout}");
}

#[test]
fn bench_inbound_pays_every_order_by_signed_events_and_reports_the_ratio_and_p99() {
    let _seat = crate::support::seats::scratch(70);
    let output = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args([
            "bench",
            "--inbound",
            "--inbound-events",
            "40",
            "--reconcile-events",
            "150",
            "--api-clients",
            "4",
        ])
        .env("DATABASE_URL", crate::support::db::admin_url())
        .env_remove("RUST_LOG")
        .output()
        .expect("run bench --inbound");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench failed:\n{stdout}\n{stderr}");
    let json_line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .expect("a JSON line");
    let report: serde_json::Value = serde_json::from_str(json_line).expect("valid JSON");
    let run = &report["inbound"];
    assert_eq!(run["events"], 40, "{run}");
    for rate in [
        "pay_per_second",
        "inbound_per_second",
        "inbound_over_pay",
        "open_loop_achieved_per_second",
        "open_loop_p50_ms",
        "open_loop_p99_ms",
        "p99_over_target",
        "reconcile_per_second",
        "reconcile_over_inbound",
    ] {
        assert!(run[rate].as_f64().is_some_and(|r| r > 0.0), "{rate}: {run}");
    }
    // Every event of the open loop answered, none dropped from the figures.
    assert_eq!(run["open_loop_samples"], 40, "{run}");
    assert_eq!(run["target_p99_ms"], 25.0, "{run}");
    assert!(run["meets_target"].is_boolean(), "{run}");
    assert!(stdout.contains("inbound/pay"), "{stdout}");
    assert!(stdout.contains("every order paid"), "{stdout}");
    // Two pages of Stripe's log, every event recovered.
    assert_eq!(run["reconcile_events"], 150, "{run}");
    assert!(stdout.contains("reconcile/inbound"), "{stdout}");
}

/// A second round's replay holds its own drain's jobs alone, though the
/// attempt and ledger tables still hold the first round's rows.
#[test]
fn bench_publish_only_replays_each_rounds_own_drain() {
    // Its drains run flat out and it bounds no time: beside one other such
    // test at most, never beside one that bounds a time.
    let _loud = crate::support::seats::loud();
    let _seat = crate::support::seats::scratch(70);
    let output = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args([
            "bench",
            "--publish-only",
            "--real-jobs",
            "100",
            "--repeat",
            "2",
        ])
        .env("DATABASE_URL", crate::support::db::admin_url())
        .env_remove("RUST_LOG")
        .output()
        .expect("run bench --publish-only");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench failed:\n{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("relay (NATS publishes)"))
        .collect();
    if lines.is_empty() {
        assert!(stderr.contains("publish drain: SKIPPED"), "{stderr}");
        return;
    }
    assert_eq!(lines.len(), 2, "{stdout}");
    for line in lines {
        assert_publish_line(line, 100);
    }
}

/// The growth rows, the repeated open loop and the plot, at tiny sizes so
/// that they cannot rot between the quiet-machine runs that quote them.
#[test]
fn bench_growth_rows_repeated_open_loop_and_plot_run_at_tiny_sizes() {
    let _seat = crate::support::seats::scratch(70);
    let plot = std::env::temp_dir().join(format!("outbox-bench-growth-{}.svg", std::process::id()));
    let _ = std::fs::remove_file(&plot);
    let output = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args([
            "bench",
            "--api-only",
            "--half-open",
            "0",
            "--api-clients",
            "1",
            "--api-duration",
            "300ms",
            "--arrival-rate",
            "20",
            "--repeat",
            "2",
            "--open-loop-duration",
            "1s",
            "--growth",
            "--growth-backlogs",
            "200,2000",
            "--growth-drained",
            "100",
            "--growth-endpoints",
            "1,3,6",
            "--growth-archive",
            "2000",
            "--latency-samples",
            "10",
            "--plot",
        ])
        .arg(&plot)
        .env("DATABASE_URL", crate::support::db::admin_url())
        .env_remove("RUST_LOG")
        .output()
        .expect("run bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench failed:\n{stdout}\n{stderr}");
    let json_line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .expect("a JSON line");
    let report: serde_json::Value = serde_json::from_str(json_line).expect("valid JSON");

    // Two runs of the one rate, each with its generator's lateness and the
    // background work during it, and the worst p99 of the two named.
    let runs = report["open_loop"].as_array().expect("open-loop runs");
    assert_eq!(runs.len(), 2, "{report}");
    for (i, run) in runs.iter().enumerate() {
        assert_eq!(run["run"], i + 1, "{run}");
        assert_eq!(run["errors"], 0, "{run}");
        assert_eq!(run["unstarted_jobs"], 0, "{run}");
        let late = &run["send_lateness_ms"];
        assert!(
            late["p99"]
                .as_f64()
                .zip(late["max"].as_f64())
                .is_some_and(|(p99, max)| p99 >= 0.0 && max >= p99),
            "{run}"
        );
        for key in ["checkpoints", "jobs_autovacuums", "jobs_autoanalyzes"] {
            assert!(
                run["background"][key].as_i64().is_some_and(|n| n >= 0),
                "{key}: {run}"
            );
        }
    }
    let p99s: Vec<f64> = runs
        .iter()
        .filter_map(|r| r["enqueue_to_start_ms"]["p99"].as_f64())
        .collect();
    let worst = &report["open_loop_worst_p99"];
    assert_eq!(worst.as_array().map(Vec::len), Some(1), "{report}");
    assert_eq!(
        worst[0]["enqueue_to_start_p99_ms"].as_f64(),
        p99s.iter().copied().reduce(f64::max),
        "{report}"
    );

    let growth = &report["growth"];
    let drains = growth["drain"].as_array().expect("growth drains");
    assert_eq!(drains.len(), 2, "{growth}");
    for (drain, backlog) in drains.iter().zip([200, 2000]) {
        assert_eq!(drain["backlog"], backlog, "{growth}");
        assert_eq!(drain["drained"], 100, "{growth}");
        assert!(
            drain["jobs_per_second"].as_f64().is_some_and(|r| r > 0.0),
            "{growth}"
        );
    }
    let placements = growth["placement"].as_array().expect("growth placements");
    assert_eq!(placements.len(), 3, "{growth}");
    for (placement, endpoints) in placements.iter().zip([1, 3, 6]) {
        assert_eq!(placement["endpoints"], endpoints, "{growth}");
        assert_eq!(placement["errors"], 0, "{growth}");
        assert!(
            placement["micros_per_order"]
                .as_f64()
                .is_some_and(|us| us > 0.0),
            "{growth}"
        );
    }
    assert!(
        growth["fan_out_fit"]["micros_per_endpoint"].is_number(),
        "{growth}"
    );
    let archive = growth["archive_latency"].as_array().expect("archive rows");
    assert_eq!(archive.len(), 2, "{growth}");
    for (row, archived) in archive.iter().zip([0, 2000]) {
        assert_eq!(row["archived"], archived, "{growth}");
        assert_eq!(row["samples"], 10, "{growth}");
        assert!(row["p99_ms"].as_f64().is_some_and(|p| p > 0.0), "{growth}");
    }
    assert!(
        stdout.contains("growth (each row") && stdout.contains("µs per endpoint"),
        "{stdout}"
    );

    let svg = std::fs::read_to_string(&plot).expect("the plot was written");
    let _ = std::fs::remove_file(&plot);
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
    for text in [
        "Drain rate off the top of a backlog",
        "jobs drained per second",
        "Order placement with endpoints subscribed",
        "per endpoint",
        "done jobs in jobs_done",
        "enqueue-to-start p99 (ms)",
        "open loop at 20/s",
    ] {
        assert!(svg.contains(text), "the plot lacks {text:?}");
    }
}
