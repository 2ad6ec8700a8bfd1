//! Draining with the real relay: the `outbox-relay relay` binary as a separate
//! process, as it runs in production, so its RSS and CPU are its own.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use diesel::prelude::*;

use super::report::DrainRun;
use super::{BenchArgs, drain_seconds, drained, enqueue_noops, stats};

pub async fn measure(url: &str, args: &BenchArgs, batch: usize) -> anyhow::Result<DrainRun> {
    let workload = Workload {
        label: batch.to_string(),
        jobs: args.jobs,
        kinds: "noop".to_owned(),
        env: Vec::new(),
        enqueue: enqueue_noops,
    };
    let (url, concurrency) = (url.to_owned(), args.concurrency);
    tokio::task::spawn_blocking(move || run(&url, &workload, concurrency, batch)).await?
}

/// What one drain enqueues and how the relay under test is configured for it.
pub struct Workload {
    /// Shown on the progress bar.
    pub label: String,
    pub jobs: usize,
    /// RELAY_KINDS of the relay.
    pub kinds: String,
    /// More environment for the relay (effect settings).
    pub env: Vec<(&'static str, String)>,
    /// Enqueues `jobs` due jobs untimed and returns the database's clock at commit.
    pub enqueue: fn(&mut PgConnection, usize) -> anyhow::Result<chrono::DateTime<chrono::Utc>>,
}

pub fn run(
    url: &str,
    workload: &Workload,
    concurrency: usize,
    batch: usize,
) -> anyhow::Result<DrainRun> {
    let jobs = workload.jobs;
    let mut conn = PgConnection::establish(url)?;
    let name = super::ceiling::conn_database(&mut conn)?;
    diesel::sql_query("TRUNCATE jobs").execute(&mut conn)?;
    let mut relay = RelayProcess::start(url, workload, concurrency, batch)?;
    // Let it connect, migrate-check and go idle, so startup is not timed.
    std::thread::sleep(Duration::from_millis(1500));
    relay.check_alive()?;

    let before = stats::read(&mut conn, &name)?;
    let cpu_before = process_cpu_seconds(Some(relay.pid()));
    let start = (workload.enqueue)(&mut conn, jobs)?;
    let progress = indicatif::ProgressBar::new(jobs as u64);
    progress.set_style(
        indicatif::ProgressStyle::with_template("  relay batch {msg} [{bar:30}] {pos}/{len}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    progress.set_message(workload.label.clone());
    // The drain is timed by the database's clock (the last finished_at), so
    // polling often buys no precision; it would only take CPU from the server
    // under test, which the ceiling's loops never pay. The count for the
    // progress bar walks the pending index, so it runs even less often.
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut last_count = Instant::now();
    while !drained(&mut conn)? {
        relay.check_alive()?;
        anyhow::ensure!(
            Instant::now() < deadline,
            "the relay did not drain {jobs} jobs in 10 minutes"
        );
        if last_count.elapsed() >= Duration::from_secs(1) {
            progress.set_position(done_estimate(&mut conn, jobs));
            last_count = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    progress.finish_and_clear();
    let seconds = drain_seconds(&mut conn, start)?;
    let cpu = process_cpu_seconds(Some(relay.pid()))
        .zip(cpu_before)
        .map(|(a, b)| a - b);
    let rss = relay.peak_rss_kib();
    relay.stop()?;
    std::thread::sleep(Duration::from_millis(300));
    let after = stats::read(&mut conn, &name)?;
    Ok(DrainRun::new(
        jobs,
        batch,
        seconds,
        after - before,
        rss,
        cpu,
    ))
}

/// Jobs done so far, from the pending partial index (cheap while it shrinks).
fn done_estimate(conn: &mut PgConnection, jobs: usize) -> u64 {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    diesel::sql_query("SELECT count(*) AS n FROM jobs WHERE status = 'pending'")
        .get_result::<Count>(conn)
        .map(|c| (jobs as u64).saturating_sub(u64::try_from(c.n).unwrap_or(0)))
        .unwrap_or(0)
}

struct RelayProcess {
    child: Child,
}

impl RelayProcess {
    fn start(
        url: &str,
        workload: &Workload,
        concurrency: usize,
        batch: usize,
    ) -> anyhow::Result<RelayProcess> {
        let exe = std::env::current_exe().context("locating the outbox-relay binary")?;
        let child = Command::new(exe)
            .args(["relay", "--kinds", &workload.kinds])
            .envs(workload.env.iter().map(|(k, v)| (k, v)))
            .env("DATABASE_URL", url)
            .env("RELAY_CONCURRENCY", concurrency.to_string())
            .env("RELAY_BATCH_SIZE", batch.to_string())
            .env("METRICS_ADDR", "127.0.0.1:0")
            .env(
                "RELAY_WORKER_ID",
                format!("bench-relay-{}", std::process::id()),
            )
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .context("starting the relay")?;
        Ok(RelayProcess { child })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn check_alive(&mut self) -> anyhow::Result<()> {
        match self.child.try_wait()? {
            Some(status) => anyhow::bail!("the relay exited early ({status})"),
            None => Ok(()),
        }
    }

    /// VmHWM: the most resident memory the process ever had.
    fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// SIGTERM and wait: the relay must exit 0 on its own.
    fn stop(mut self) -> anyhow::Result<()> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait()? {
                anyhow::ensure!(
                    status.success(),
                    "the relay exited with {status} after SIGTERM"
                );
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                anyhow::bail!("the relay did not stop within 30s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// User + system CPU seconds of `pid` (this process when `None`), from /proc.
pub fn process_cpu_seconds(pid: Option<u32>) -> Option<f64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_owned(),
    };
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // Linux reports these in USER_HZ, which is 100 on every mainstream platform.
    Some((utime + stime) / 100.0)
}
