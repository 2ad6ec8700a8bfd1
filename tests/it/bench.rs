//! `outbox-relay bench` runs end to end on a tiny workload and prints its JSON line.

use std::process::Command;

#[test]
fn bench_runs_a_small_workload_and_reports_every_figure() {
    let child = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args([
            "bench",
            "--jobs",
            "300",
            "--latency-samples",
            "20",
            "--api-clients",
            "4",
            "--api-duration",
            "1s",
            "--half-open",
            "200",
            "--effects",
            "real",
            "--real-jobs",
            "200",
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
    }
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
    // POST /orders latency, alone and with half-open connections held open.
    let placement = &report["placement"];
    assert!(
        placement["latency_ms"]["p99"]
            .as_f64()
            .is_some_and(|p| p > 0.0),
        "{placement}"
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
