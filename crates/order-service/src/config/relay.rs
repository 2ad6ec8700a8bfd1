//! What `relay` reads, and the relay settings and session timeouts made of it.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use outbox_core::worker_pool::{self, BackoffPolicy, JobTimeouts, MIN_LEASE, PoolSettings};

use super::parse::{
    parse_count, parse_duration, parse_job_timeouts, parse_kind, parse_positive_duration,
    parse_socket_addr,
};
use super::{
    ConfigError, DEFAULT_METRICS_ADDR, EffectArgs, EnqueueArgs, HttpLimitsArgs, LinkArgs,
    PaymentWindowArgs, ReceiptArgs, ReconcileArgs,
};
use crate::kinds::EffectKind;

/// Everything `relay` reads.
#[derive(Debug, Clone, Args)]
pub struct RelayArgs {
    /// Job kinds this relay claims, comma-separated (default: all).
    #[arg(long, env = "RELAY_KINDS", value_delimiter = ',', value_parser = parse_kind)]
    pub kinds: Vec<EffectKind>,
    /// Effects in flight at most.
    #[arg(long, env = "RELAY_CONCURRENCY", default_value_t = worker_pool::DEFAULT_CONCURRENCY, value_parser = parse_count)]
    pub concurrency: usize,
    /// Pooled database connections of this relay, for its effects (default:
    /// concurrency, at most 16, plus 4); its claims and outcomes run on
    /// connections of their own.
    #[arg(long, env = "RELAY_POOL_SIZE", value_parser = parse_count)]
    pub pool_size: Option<usize>,
    /// Statements writing outcomes side by side, each on its own connection
    /// (default: 2; 1 at concurrency 1).
    #[arg(long, env = "RELAY_COMPLETER_WRITERS", value_parser = parse_count)]
    pub completer_writers: Option<usize>,
    /// Jobs per claim at most.
    #[arg(long = "batch-size", env = "RELAY_BATCH_SIZE", default_value_t = worker_pool::DEFAULT_BATCH_SIZE, value_parser = parse_count)]
    pub batch_size: usize,
    /// Lease length: a job whose worker stops renewing it is reaped after this.
    #[arg(long, env = "RELAY_LEASE", default_value = "60s", value_parser = parse_positive_duration)]
    pub lease: Duration,
    /// First retry delay.
    #[arg(long, env = "RELAY_BACKOFF_BASE", default_value = "1s", value_parser = parse_positive_duration)]
    pub backoff_base: Duration,
    /// Longest retry delay.
    #[arg(long, env = "RELAY_BACKOFF_MAX", default_value = "1h", value_parser = parse_positive_duration)]
    pub backoff_max: Duration,
    /// Fallback poll when no NOTIFY arrives.
    #[arg(long, env = "RELAY_POLL_INTERVAL", default_value = "1s", value_parser = parse_positive_duration)]
    pub poll_interval: Duration,
    /// How long in-flight effects may finish after SIGTERM/SIGINT.
    #[arg(long, env = "RELAY_SHUTDOWN_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// locked_by value (default: hostname-pid-random; informative only, since
    /// fencing uses each claim's lease_token).
    #[arg(long, env = "RELAY_WORKER_ID")]
    pub worker_id: Option<String>,
    /// Deadline of one effect, past which it is cancelled and the attempt is a
    /// retryable failure: `5m`, or with per-kind overrides `5m,receipt_pdf=30s`.
    #[arg(long, env = "RELAY_JOB_TIMEOUT", default_value = "5m", value_parser = parse_job_timeouts)]
    pub job_timeout: JobTimeouts,
    /// statement_timeout of the relay's database sessions (default: a quarter
    /// of the lease, at most 10s).
    #[arg(long, env = "RELAY_STATEMENT_TIMEOUT", value_parser = parse_positive_duration)]
    pub statement_timeout: Option<Duration>,
    /// lock_timeout of the relay's database sessions (default: a tenth of the
    /// lease, at most 5s).
    #[arg(long, env = "RELAY_LOCK_TIMEOUT", value_parser = parse_positive_duration)]
    pub lock_timeout: Option<Duration>,
    /// idle_in_transaction_session_timeout of the relay's database sessions
    /// (default: a quarter of the lease, at most 10s).
    #[arg(long, env = "RELAY_IDLE_IN_TRANSACTION_TIMEOUT", value_parser = parse_positive_duration)]
    pub idle_in_transaction_timeout: Option<Duration>,
    /// /livez answers 503 once claiming or writing outcomes has made no
    /// progress for this long although there was work.
    #[arg(long, env = "RELAY_STALL_TIMEOUT", default_value = "2m", value_parser = parse_positive_duration)]
    pub stall_timeout: Duration,
    /// Address of /metrics, /healthz, /readyz and /livez.
    #[arg(long, env = "METRICS_ADDR", default_value = DEFAULT_METRICS_ADDR, value_parser = parse_socket_addr)]
    pub metrics_addr: SocketAddr,
    #[command(flatten)]
    pub http: HttpLimitsArgs,
    #[command(flatten)]
    pub effects: EffectArgs,
    #[command(flatten)]
    pub receipt: ReceiptArgs,
    #[command(flatten)]
    pub links: LinkArgs,
    #[command(flatten)]
    pub payment_window: PaymentWindowArgs,
    #[command(flatten)]
    pub reconcile: ReconcileArgs,
    /// `max_attempts` and `FANOUT_INLINE` of the jobs a relay enqueues
    /// itself: an expired order's, or one a reconciled payment pays.
    #[command(flatten)]
    pub enqueue: EnqueueArgs,
}

impl RelayArgs {
    /// The kinds to claim: `--kinds`, or every known kind.
    pub fn kinds(&self) -> Vec<EffectKind> {
        if self.kinds.is_empty() {
            EffectKind::ALL.to_vec()
        } else {
            let mut kinds = self.kinds.clone();
            kinds.dedup();
            kinds
        }
    }

    pub fn settings(&self) -> Result<PoolSettings, ConfigError> {
        if self.backoff_base > self.backoff_max {
            return Err(ConfigError(format!(
                "RELAY_BACKOFF_BASE ({}) is larger than RELAY_BACKOFF_MAX ({})",
                humantime::format_duration(self.backoff_base),
                humantime::format_duration(self.backoff_max)
            )));
        }
        if self.lease < MIN_LEASE {
            return Err(ConfigError(format!(
                "RELAY_LEASE ({}) must be at least {}",
                humantime::format_duration(self.lease),
                humantime::format_duration(MIN_LEASE)
            )));
        }
        let worker_id = self.worker_id.clone().unwrap_or_else(default_worker_id);
        let mut settings = PoolSettings::new(
            worker_id,
            self.kinds().iter().map(|k| k.as_str().to_owned()).collect(),
        )
        .with_lease(self.lease);
        settings.concurrency = self.concurrency;
        settings.batch_size = self.batch_size;
        settings.completer_writers = self.completer_writers;
        settings.poll_interval = self.poll_interval;
        settings.shutdown_grace = self.shutdown_grace;
        settings.backoff = BackoffPolicy {
            base: self.backoff_base,
            max: self.backoff_max,
        };
        settings.job_timeouts = self.job_timeout.clone();
        settings.stall_timeout = self.stall_timeout;
        self.session_timeouts()?;
        Ok(settings)
    }

    /// The relay's session timeouts: each well under the lease, so that a
    /// heartbeat or an outcome stuck behind a lock fails and is retried long
    /// before the leases it should renew run out.
    pub fn session_timeouts(&self) -> Result<SessionTimeouts, ConfigError> {
        let lease = self.lease;
        // A quarter (a tenth) of the lease, but not so short that a busy
        // server's ordinary claim trips it, nor over half the lease.
        let derived = |share: u32, floor_ms: u64, cap_s: u64| {
            (lease / share)
                .max(Duration::from_millis(floor_ms))
                .min(Duration::from_secs(cap_s))
                .min(lease / 2)
        };
        let timeouts = SessionTimeouts {
            statement: self
                .statement_timeout
                .unwrap_or_else(|| derived(4, 1000, 10)),
            lock: self.lock_timeout.unwrap_or_else(|| derived(10, 500, 5)),
            idle_in_transaction: self
                .idle_in_transaction_timeout
                .unwrap_or_else(|| derived(4, 1000, 10)),
        };
        for (variable, value) in [
            ("RELAY_STATEMENT_TIMEOUT", timeouts.statement),
            ("RELAY_LOCK_TIMEOUT", timeouts.lock),
            (
                "RELAY_IDLE_IN_TRANSACTION_TIMEOUT",
                timeouts.idle_in_transaction,
            ),
        ] {
            if value > lease / 2 {
                return Err(ConfigError(format!(
                    "{variable} ({}) must be at most half of RELAY_LEASE ({}), so that a stuck \
                     statement fails before the leases it holds run out",
                    humantime::format_duration(value),
                    humantime::format_duration(lease)
                )));
            }
        }
        Ok(timeouts)
    }
}

/// Timeouts of the relay's database sessions; see [`RelayArgs::session_timeouts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionTimeouts {
    pub statement: Duration,
    pub lock: Duration,
    pub idle_in_transaction: Duration,
}

/// `hostname-pid-random`, the default `locked_by`. The random part tells apart
/// containers that share a hostname and all run as pid 1.
pub fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "relay".to_owned());
    format!(
        "{host}-{}-{:06x}",
        std::process::id(),
        fastrand::u32(..0x0100_0000)
    )
}

#[cfg(test)]
mod tests {
    use super::super::relay_args;
    use super::*;

    #[test]
    fn session_timeouts_default_to_shares_of_the_lease_and_must_stay_under_half_of_it() {
        let defaults = relay_args(&[]).expect("defaults parse");
        assert_eq!(
            defaults.session_timeouts().expect("valid"),
            SessionTimeouts {
                statement: Duration::from_secs(10),
                lock: Duration::from_secs(5),
                idle_in_transaction: Duration::from_secs(10),
            }
        );
        let short = relay_args(&["--lease", "2s"]).expect("parses");
        assert_eq!(
            short.session_timeouts().expect("valid"),
            SessionTimeouts {
                statement: Duration::from_secs(1),
                lock: Duration::from_millis(500),
                idle_in_transaction: Duration::from_secs(1),
            }
        );
        let too_long = relay_args(&["--lease", "10s", "--lock-timeout", "6s"]).expect("parses");
        let error = too_long
            .session_timeouts()
            .expect_err("over half the lease");
        assert!(error.0.contains("RELAY_LOCK_TIMEOUT (6s)"), "{error}");
    }

    #[test]
    fn a_job_timeout_with_per_kind_overrides_reaches_the_relay_settings() {
        let args = relay_args(&["--job-timeout", "90s,receipt_pdf=20s"]).expect("parses");
        let settings = args.settings().expect("valid");
        assert_eq!(
            settings.job_timeouts.for_kind("receipt_pdf"),
            Duration::from_secs(20)
        );
        assert_eq!(
            settings.job_timeouts.for_kind("noop"),
            Duration::from_secs(90)
        );
        let error = relay_args(&["--job-timeout", "soon"]).expect_err("refused");
        assert!(error.to_string().contains("soon"), "{error}");
    }

    #[test]
    fn default_worker_ids_differ_between_processes_with_the_same_hostname_and_pid() {
        assert_ne!(default_worker_id(), default_worker_id());
    }
}
