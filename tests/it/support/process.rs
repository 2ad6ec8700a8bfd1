//! The built `outbox-relay` binary as a separate process, for fault injection:
//! started with a clean environment, its stdout and stderr captured to files
//! (for grepping after the fact), signalled by PID with `kill -s`, and killed
//! when the handle is dropped.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The binary under test, built by Cargo for this test target.
pub const BIN: &str = env!("CARGO_BIN_EXE_outbox-relay");

/// Sender of the confirmation emails of every process started here; its domain
/// is the right-hand side of every `Message-ID`.
pub const MAIL_FROM: &str = "Shop <orders@shop.example>";

/// What to start: a subcommand, its flags and its whole environment.
#[derive(Debug, Clone)]
pub struct Launch {
    name: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Launch {
    /// `outbox-relay <args>` with only `PATH`, `NO_COLOR=1` and `RUST_LOG=info`
    /// from the environment: nothing the test process happens to carry
    /// (`DATABASE_URL`, `RUST_LOG`, `LOG_FORMAT`) leaks into the child.
    pub fn new(name: &str, args: &[&str]) -> Launch {
        Launch {
            name: name.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env: vec![
                ("PATH".into(), std::env::var("PATH").unwrap_or_default()),
                ("NO_COLOR".into(), "1".into()),
                ("RUST_LOG".into(), "info".into()),
            ],
        }
    }

    /// `relay` as the fault tests run it: worker id `name`, metrics on port 0,
    /// a 2s lease, quick retries and polls, a 10s shutdown grace, the tests'
    /// `LINK_SIGNING_KEY`, no periodic reconciliation. Mail and webhook
    /// settings are the caller's.
    pub fn relay(name: &str, database_url: &str) -> Launch {
        Launch::new(name, &["relay"])
            .env("DATABASE_URL", database_url)
            .env("RELAY_WORKER_ID", name)
            .env("METRICS_ADDR", "127.0.0.1:0")
            .env("RELAY_LEASE", "2s")
            .env("RELAY_BACKOFF_BASE", "100ms")
            .env("RELAY_BACKOFF_MAX", "1s")
            .env("RELAY_POLL_INTERVAL", "250ms")
            .env("RELAY_SHUTDOWN_GRACE", "10s")
            .env("WEBHOOK_TIMEOUT", "10s")
            // The tests' receivers listen on 127.0.0.1, over plain http.
            .env("WEBHOOK_ALLOW_PRIVATE", "true")
            .env("WEBHOOK_ALLOW_HTTP", "true")
            .env("MAIL_FROM", MAIL_FROM)
            .env("LINK_SIGNING_KEY", super::app::LINK_SIGNING_KEY)
            // Its slot, every quarter hour, would add a job to whichever
            // test runs across one; the reconciliation tests set their own.
            .env("INBOX_RECONCILE_EVERY", "off")
    }

    /// `serve` on port 0 (its metrics too), with the tests' `LINK_SIGNING_KEY`.
    pub fn serve(name: &str, database_url: &str) -> Launch {
        Launch::new(name, &["serve"])
            .env("DATABASE_URL", database_url)
            .env("API_ADDR", "127.0.0.1:0")
            .env("METRICS_ADDR", "127.0.0.1:0")
            .env("LINK_SIGNING_KEY", super::app::LINK_SIGNING_KEY)
    }

    /// Sets (or replaces) one environment variable.
    pub fn env(mut self, key: &str, value: impl Into<String>) -> Launch {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.into()));
        self
    }

    /// Leaves `key` out of the child's environment.
    pub fn without_env(mut self, key: &str) -> Launch {
        self.env.retain(|(k, _)| k != key);
        self
    }

    pub fn arg(mut self, arg: &str) -> Launch {
        self.args.push(arg.to_owned());
        self
    }

    pub fn args(mut self, args: &[&str]) -> Launch {
        self.args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }

    /// Starts the process; stdout and stderr go to files under Cargo's
    /// per-target temporary directory.
    pub fn spawn(self) -> BinProcess {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fault-logs");
        std::fs::create_dir_all(&dir).expect("create the log directory");
        let stem = format!(
            "{}-{}-{:08x}",
            self.name,
            std::process::id(),
            fastrand::u32(..)
        );
        let stderr_path = dir.join(format!("{stem}.stderr.log"));
        let stdout_path = dir.join(format!("{stem}.stdout.log"));
        let stderr = std::fs::File::create(&stderr_path).expect("create the stderr log");
        let stdout = std::fs::File::create(&stdout_path).expect("create the stdout log");
        let child = Command::new(BIN)
            .args(&self.args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
        BinProcess {
            name: self.name,
            pid: child.id(),
            child: Some(child),
            status: None,
            stderr_path,
            stdout_path,
        }
    }
}

/// A running (or exited) `outbox-relay` process; SIGKILLed on drop if still alive.
#[derive(Debug)]
pub struct BinProcess {
    name: String,
    pid: u32,
    child: Option<Child>,
    status: Option<ExitStatus>,
    stderr_path: PathBuf,
    stdout_path: PathBuf,
}

impl BinProcess {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sends `signal` (`KILL`, `STOP`, `CONT`, `TERM`, ...) with `kill -s`.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args(["-s", signal, &self.pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -s {signal} {} failed", self.pid);
    }

    pub fn sigkill(&self) {
        self.signal("KILL");
    }
    pub fn sigstop(&self) {
        self.signal("STOP");
    }
    pub fn sigcont(&self) {
        self.signal("CONT");
    }
    pub fn sigterm(&self) {
        self.signal("TERM");
    }

    /// Everything the process wrote to stderr so far (its logs).
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.stderr_path).unwrap_or_default()).into_owned()
    }

    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.stdout_path).unwrap_or_default()).into_owned()
    }

    /// Both captured streams.
    pub fn output(&self) -> String {
        format!("{}{}", self.stdout(), self.stderr())
    }

    /// The exit status, if the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none()
            && let Some(child) = &mut self.child
            && let Ok(Some(status)) = child.try_wait()
        {
            self.status = Some(status);
        }
        self.status
    }

    pub fn is_running(&mut self) -> bool {
        self.exited().is_none()
    }

    /// Waits for the process to exit; panics with its log after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {timeout:?}; its log:\n{}",
                self.name,
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for a line of stdout or stderr containing `needle` and returns it.
    /// Panics, showing the log, on timeout or if the process exits first.
    pub async fn wait_for_line(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.output().lines().find(|l| l.contains(needle)) {
                return line.to_owned();
            }
            if let Some(status) = self.exited() {
                // One last look: the line may have been written just before exit.
                if let Some(line) = self.output().lines().find(|l| l.contains(needle)) {
                    return line.to_owned();
                }
                panic!(
                    "{} exited ({status}) before logging {needle:?}; its output:\n{}",
                    self.name,
                    self.output()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} did not log {needle:?} within {timeout:?}; its output:\n{}",
                self.name,
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts a relay and waits until it logged "relay started" (it has
    /// migrated and is claiming) and the address of its metrics endpoint.
    pub async fn start_relay(launch: Launch) -> (BinProcess, String) {
        let mut relay = launch.spawn();
        let line = relay
            .wait_for_line("serving /metrics", Duration::from_secs(60))
            .await;
        let addr = field(&line, "addr")
            .unwrap_or_else(|| panic!("no addr= in {line:?}"))
            .to_owned();
        relay
            .wait_for_line("relay started", Duration::from_secs(60))
            .await;
        (relay, format!("http://{addr}"))
    }

    /// Starts `serve` and returns it with its base URL, read from stdout.
    pub async fn start_api(launch: Launch) -> (BinProcess, String) {
        let mut api = launch.spawn();
        let line = api
            .wait_for_line("serving the order API on ", Duration::from_secs(60))
            .await;
        let base = line
            .rsplit(' ')
            .next()
            .filter(|b| b.starts_with("http://"))
            .unwrap_or_else(|| panic!("no URL in {line:?}"))
            .to_owned();
        (api, base)
    }

    /// Sends SIGTERM and waits for a clean exit (status 0).
    pub async fn terminate(&mut self) {
        self.sigterm();
        let status = self.wait_exit(Duration::from_secs(60)).await;
        assert_eq!(
            status.code(),
            Some(0),
            "{} exits 0 on SIGTERM, not {status}; its log:\n{}",
            self.name,
            self.stderr()
        );
    }
}

/// The value of `key=value` in a plain-text log line.
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let needle = format!("{key}=");
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(needle.as_str()))
}

impl Drop for BinProcess {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child
            && self.status.is_none()
        {
            // SIGKILL also ends a SIGSTOPped process.
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() || std::env::var_os("KEEP_FAULT_LOGS").is_some() {
            eprintln!(
                "logs of {} (pid {}) kept: {} {}",
                self.name,
                self.pid,
                self.stderr_path.display(),
                self.stdout_path.display()
            );
        } else {
            let _ = std::fs::remove_file(&self.stderr_path);
            let _ = std::fs::remove_file(&self.stdout_path);
        }
    }
}
