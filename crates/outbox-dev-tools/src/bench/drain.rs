//! Draining with the real relay: the `outbox-relay relay` binary as a separate
//! process, as it runs in production, so its RSS and CPU are its own.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use diesel::prelude::*;

use super::queue::{drain_seconds, drained, enqueue_keyed_noops, enqueue_noops};
use super::report::DrainRun;
use super::{BenchArgs, stats};

pub async fn measure(url: &str, args: &BenchArgs, batch: usize) -> anyhow::Result<DrainRun> {
    measure_pinned(url, args, batch, None).await
}

/// [`measure`] with the MVCC horizon pinned for up to `pin` (`None`: not pinned).
pub async fn measure_pinned(
    url: &str,
    args: &BenchArgs,
    batch: usize,
    pin: Option<Duration>,
) -> anyhow::Result<DrainRun> {
    let workload = Workload {
        label: match pin {
            Some(_) => format!("{batch}, pinned horizon"),
            None => batch.to_string(),
        },
        jobs: args.jobs,
        kinds: "noop".to_owned(),
        env: Vec::new(),
        enqueue: enqueue_noops,
        keys: None,
        pin,
        exe: None,
    };
    let (url, concurrency) = (url.to_owned(), args.concurrency);
    tokio::task::spawn_blocking(move || run(&url, &workload, concurrency, batch)).await?
}

/// [`measure`] with the jobs spread over `keys` concurrency keys.
pub async fn measure_keyed(
    url: &str,
    args: &BenchArgs,
    batch: usize,
    keys: usize,
) -> anyhow::Result<DrainRun> {
    let workload = Workload {
        label: format!("{batch}, {keys} keys"),
        jobs: args.jobs,
        kinds: "noop".to_owned(),
        env: Vec::new(),
        enqueue: enqueue_noops,
        keys: Some(keys),
        pin: None,
        exe: None,
    };
    let (url, concurrency) = (url.to_owned(), args.concurrency);
    tokio::task::spawn_blocking(move || run(&url, &workload, concurrency, batch)).await?
}

/// [`measure`] with another build's relay (`--baseline-relay`): the same
/// drain, by the binary at `exe`.
pub async fn measure_baseline(
    url: &str,
    args: &BenchArgs,
    batch: usize,
    exe: &std::path::Path,
) -> anyhow::Result<DrainRun> {
    let workload = Workload {
        label: format!("{batch}, baseline build"),
        jobs: args.jobs,
        kinds: "noop".to_owned(),
        env: Vec::new(),
        enqueue: enqueue_noops,
        keys: None,
        pin: None,
        exe: Some(exe.to_owned()),
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
    /// Enqueues `jobs` due jobs untimed; the marks hold the database's clock
    /// at commit and the counters around the enqueue.
    pub enqueue: fn(&mut PgConnection, usize) -> anyhow::Result<stats::EnqueueMarks>,
    /// Spread the `noop` jobs over this many concurrency keys instead
    /// (`enqueue` is not used then).
    pub keys: Option<usize>,
    /// Hold a snapshot open from before the enqueue for up to this long.
    pub pin: Option<Duration>,
    /// The `outbox-relay` binary whose relay drains (`None`: this one).
    pub exe: Option<std::path::PathBuf>,
}

pub fn run(
    url: &str,
    workload: &Workload,
    concurrency: usize,
    batch: usize,
) -> anyhow::Result<DrainRun> {
    let jobs = workload.jobs;
    let mut conn = PgConnection::establish(url)?;
    let name = stats::conn_database(&mut conn)?;
    diesel::sql_query("TRUNCATE jobs, jobs_done, job_claims").execute(&mut conn)?;
    let since = super::listening::server_clock(&mut conn)?;
    let mut relay = RelayProcess::start(url, workload, concurrency, batch)?;
    // Let it connect, migrate-check and go idle, so startup is not timed.
    super::listening::wait_for_listener(&mut conn, &since)?;
    relay.check_alive()?;

    let pin = workload
        .pin
        .map(|hold| PinnedHorizon::take(url, hold))
        .transpose()?;
    let before = stats::read(&mut conn, &name)?;
    let tokens_before = lease_tokens_drawn(&mut conn);
    let marks = match workload.keys {
        Some(keys) => enqueue_keyed_noops(&mut conn, jobs, keys)?,
        None => (workload.enqueue)(&mut conn, jobs)?,
    };
    // Read once the enqueue has committed, as the ceiling reads them: the
    // server's CPU for inserting the backlog is not the drain's, and the
    // ceiling's figure never held it. The relay wakes at that commit, so
    // what it does before these reads is a claim at most.
    let cpu_before = process_cpu_seconds(Some(relay.pid()));
    let server_cpu_before = server_cpu_seconds();
    let start = marks.committed_at;
    let progress = indicatif::ProgressBar::new(jobs as u64);
    progress.set_style(
        indicatif::ProgressStyle::with_template("  relay batch {msg} [{bar:30}] {pos}/{len}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    progress.set_message(workload.label.clone());
    // The drain is timed by the database's clock (the last finished_at), so
    // polling often buys no precision; it would only take CPU from the server
    // under test, which the ceiling's loops never pay. The progress bar reads
    // the lease-token sequence (one value per claim: claims, not finishes,
    // but it costs no scan) and only when it is drawn at all.
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut last_count = Instant::now();
    while !drained(&mut conn)? {
        relay.check_alive()?;
        anyhow::ensure!(
            Instant::now() < deadline,
            "the relay did not drain {jobs} jobs in 10 minutes"
        );
        if !progress.is_hidden() && last_count.elapsed() >= Duration::from_secs(1) {
            if let (Some(now), Some(before)) = (lease_tokens_drawn(&mut conn), tokens_before) {
                progress.set_position(u64::try_from(now - before).unwrap_or(0).min(jobs as u64));
            }
            last_count = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    progress.finish_and_clear();
    let pinned = pin.map(PinnedHorizon::release).transpose()?;
    let seconds = drain_seconds(&mut conn, start)?;
    let cpu = process_cpu_seconds(Some(relay.pid()))
        .zip(cpu_before)
        .map(|(a, b)| a - b);
    let server_cpu = server_cpu_seconds()
        .zip(server_cpu_before)
        .map(|(a, b)| a - b);
    let rss = relay.peak_rss_kib();
    relay.stop()?;
    std::thread::sleep(Duration::from_millis(300));
    let after = stats::read(&mut conn, &name)?;
    let cost = stats::db_cost(&mut conn, jobs, &marks)?;
    let mut run = DrainRun::new(jobs, batch, seconds, after - before, rss, cpu)
        .with_cost(cost)
        .with_server_cpu(server_cpu);
    if let Some(held) = pinned {
        run = run.with_pin(held);
    }
    Ok(run)
}

/// The lease-token sequence's last value: every claim draws one, so the
/// difference over a drain counts its claims. `None` before the first draw.
pub(super) fn lease_tokens_drawn(conn: &mut PgConnection) -> Option<i64> {
    #[derive(QueryableByName)]
    struct Last {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        last: i64,
    }
    diesel::sql_query("SELECT last_value AS last FROM jobs_lease_token_seq")
        .get_result::<Last>(conn)
        .ok()
        .map(|l| l.last)
}

/// A REPEATABLE READ transaction on its own connection whose snapshot, taken
/// by a real read, holds back the xmin horizon: no row version that dies
/// after it was taken can be pruned or vacuumed away while it is open.
struct PinnedHorizon {
    release: std::sync::mpsc::Sender<()>,
    holder: std::thread::JoinHandle<anyhow::Result<Duration>>,
}

impl PinnedHorizon {
    /// Returns once the snapshot is taken; it is let go after `hold`, or on
    /// [`PinnedHorizon::release`], whichever comes first.
    fn take(url: &str, hold: Duration) -> anyhow::Result<PinnedHorizon> {
        let (release, released) = std::sync::mpsc::channel::<()>();
        let (taken_tx, taken) = std::sync::mpsc::channel::<anyhow::Result<()>>();
        let url = url.to_owned();
        let holder = std::thread::spawn(move || -> anyhow::Result<Duration> {
            let mut conn = PgConnection::establish(&url)?;
            conn.build_transaction().repeatable_read().read_only().run(
                |conn| -> anyhow::Result<Duration> {
                    #[derive(QueryableByName)]
                    struct Pinned {
                        #[diesel(sql_type = diesel::sql_types::Bool)]
                        pinned: bool,
                    }
                    // The first query takes the transaction's snapshot; BEGIN
                    // alone takes none.
                    let row: Result<Pinned, _> = diesel::sql_query(
                        "SELECT (SELECT count(*) FROM orders) >= 0 \
                                AND (SELECT backend_xmin IS NOT NULL FROM pg_stat_activity \
                                     WHERE pid = pg_backend_pid()) AS pinned",
                    )
                    .get_result(conn);
                    let taken_at = Instant::now();
                    let pinned = match row {
                        Ok(row) if row.pinned => Ok(()),
                        Ok(_) => Err(anyhow::anyhow!("the snapshot holds no xmin")),
                        Err(e) => Err(anyhow::Error::from(e).context("taking the snapshot")),
                    };
                    let failed = pinned.is_err();
                    let _ = taken_tx.send(pinned);
                    if !failed {
                        let _ = released.recv_timeout(hold);
                    }
                    Ok(taken_at.elapsed())
                },
            )
        });
        match taken.recv() {
            Ok(Ok(())) => Ok(PinnedHorizon { release, holder }),
            Ok(Err(error)) => Err(error.context("pinning the horizon")),
            Err(_) => match holder.join() {
                Ok(Err(error)) => Err(error.context("pinning the horizon")),
                _ => anyhow::bail!("the horizon-pinning connection ended before its snapshot"),
            },
        }
    }

    /// Ends the transaction and returns how long its snapshot was held.
    fn release(self) -> anyhow::Result<Duration> {
        let _ = self.release.send(());
        self.holder
            .join()
            .map_err(|_| anyhow::anyhow!("the horizon-pinning thread panicked"))?
    }
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
        let exe = match &workload.exe {
            Some(exe) => exe.clone(),
            None => std::env::current_exe().context("locating the outbox-relay binary")?,
        };
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
    let stat = ProcStat::read(&path)?;
    Some(stat.own)
}

/// User + system CPU seconds of the children this process has waited for
/// (pgbench, say), from /proc.
pub fn waited_children_cpu_seconds() -> Option<f64> {
    ProcStat::read("/proc/self/stat").map(|stat| stat.children)
}

/// User + system CPU seconds of every PostgreSQL process on this machine,
/// the backends that have exited included (their time is the postmaster's
/// children's). `None` when no server runs here (a remote `--database-url`).
/// What the server spent on a drain, to set beside the relay's own CPU: on a
/// machine the two share, a job's cost is the sum.
pub fn server_cpu_seconds() -> Option<f64> {
    let mut servers = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(stat) = ProcStat::read(&format!("/proc/{pid}/stat"))
            && stat.comm == "postgres"
        {
            servers.insert(pid, stat);
        }
    }
    let total = servers
        .values()
        // The postmaster reaps every backend: its children's time is theirs.
        .map(|stat| match servers.contains_key(&stat.ppid) {
            true => stat.own,
            false => stat.own + stat.children,
        })
        .sum();
    (!servers.is_empty()).then_some(total)
}

/// The fields of `/proc/PID/stat` the bench reads.
struct ProcStat {
    comm: String,
    ppid: u32,
    /// utime + stime, in seconds.
    own: f64,
    /// cutime + cstime: of the children this process has waited for.
    children: f64,
}

impl ProcStat {
    fn read(path: &str) -> Option<ProcStat> {
        let stat = std::fs::read_to_string(path).ok()?;
        // The command name is in parentheses and may hold spaces.
        let open = stat.find('(')?;
        let close = stat.rfind(')')?;
        let comm = stat.get(open + 1..close)?.to_owned();
        let fields: Vec<&str> = stat.get(close + 2..)?.split_whitespace().collect();
        let field = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
        // Linux reports times in USER_HZ, which is 100 on every mainstream platform.
        Some(ProcStat {
            comm,
            ppid: fields.get(1)?.parse().ok()?,
            own: (field(11)? + field(12)?) / 100.0,
            children: (field(13)? + field(14)?) / 100.0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_reads_as_itself_and_a_command_name_with_spaces_and_parentheses_is_whole() {
        let me = ProcStat::read("/proc/self/stat").expect("a readable stat");
        assert_eq!(me.ppid, std::os::unix::process::parent_id());
        assert!(me.own >= 0.0 && me.children >= 0.0);

        let dir = std::env::temp_dir().join(format!("stat-{}", std::process::id()));
        std::fs::write(
            &dir,
            "42 (post gres) x) S 7 1 1 0 -1 0 0 0 0 0 250 50 3 4 20 0",
        )
        .expect("write");
        let odd = ProcStat::read(&dir.to_string_lossy()).expect("parsed");
        let _ = std::fs::remove_file(&dir);
        assert_eq!(odd.comm, "post gres) x");
        assert_eq!(odd.ppid, 7);
        assert!((odd.own - 3.0).abs() < 1e-9, "{}", odd.own);
        assert!((odd.children - 0.07).abs() < 1e-9, "{}", odd.children);
    }
}
