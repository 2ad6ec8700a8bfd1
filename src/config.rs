//! Typed settings from flags and the environment (DESIGN.md, "CLI"), validated
//! at start. Every flag also reads its environment variable; a bad value is a
//! clear error naming the flag, the variable and the value.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::effects::EffectKind;
use crate::effects::email::EmailConfig;
use crate::effects::receipt::ReceiptSettings;
use crate::effects::webhook::WebhookConfig;
use crate::http_server::{self, ConnectionLimits};
use crate::relay::{self, BackoffPolicy, JobTimeouts, RelaySettings};

pub const DEFAULT_API_ADDR: &str = "127.0.0.1:8080";
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9187";
pub const DEFAULT_PUBLIC_BASE_URL: &str = "http://127.0.0.1:8080";
pub const DEFAULT_WEBHOOK_TIMEOUT: Duration = Duration::from_secs(30);

/// Parses a human duration: `500ms`, `30s`, `5m`, `1h`, `7d`.
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    humantime::parse_duration(raw.trim())
        .map_err(|e| format!("{e} (expected a duration such as 500ms, 30s, 5m, 1h or 7d)"))
}

/// A duration that must be more than zero.
pub fn parse_positive_duration(raw: &str) -> Result<Duration, String> {
    let d = parse_duration(raw)?;
    if d.is_zero() {
        return Err("must be more than zero".into());
    }
    Ok(d)
}

/// A PostgreSQL URL (`postgres://` or `postgresql://`).
pub fn parse_database_url(raw: &str) -> Result<String, String> {
    let url = url::Url::parse(raw).map_err(|e| format!("not a URL: {e}"))?;
    match url.scheme() {
        "postgres" | "postgresql" => Ok(raw.to_owned()),
        other => Err(format!(
            "scheme {other:?} is not postgres:// or postgresql://"
        )),
    }
}

/// An `http://` or `https://` URL.
pub fn parse_http_url(raw: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(raw).map_err(|e| format!("not a URL: {e}"))?;
    match url.scheme() {
        "http" | "https" if url.host().is_some() => Ok(url),
        "http" | "https" => Err("has no host".into()),
        other => Err(format!("scheme {other:?} is not http:// or https://")),
    }
}

pub fn parse_socket_addr(raw: &str) -> Result<SocketAddr, String> {
    raw.parse()
        .map_err(|e| format!("{e} (expected host:port such as 127.0.0.1:8080)"))
}

/// A whole number from 1 to 100,000.
pub fn parse_count(raw: &str) -> Result<usize, String> {
    let n: usize = raw
        .trim()
        .parse()
        .map_err(|_| "expected a whole number".to_owned())?;
    if !(1..=100_000).contains(&n) {
        return Err("must be between 1 and 100000".into());
    }
    Ok(n)
}

fn parse_max_attempts(raw: &str) -> Result<i32, String> {
    let n: i32 = raw
        .trim()
        .parse()
        .map_err(|_| "expected a whole number".to_owned())?;
    if !(1..=1000).contains(&n) {
        return Err("must be between 1 and 1000".into());
    }
    Ok(n)
}

fn parse_kind(raw: &str) -> Result<EffectKind, String> {
    raw.trim().parse()
}

#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// PostgreSQL URL.
    #[arg(long, env = "DATABASE_URL", value_parser = parse_database_url, hide_env_values = true)]
    pub database_url: String,
}

/// A whole number of requests from 1 to 1,000,000.
fn parse_requests(raw: &str) -> Result<u64, String> {
    let n: u64 = raw
        .trim()
        .parse()
        .map_err(|_| "expected a whole number".to_owned())?;
    if !(1..=1_000_000).contains(&n) {
        return Err("must be between 1 and 1000000".into());
    }
    Ok(n)
}

/// What a client of an HTTP listener (`serve`'s API, the relay's metrics
/// port) may hold, and for how long.
#[derive(Debug, Clone, Args)]
pub struct HttpLimitsArgs {
    /// Longest wait for a request's headers, on a new connection or an idle
    /// keep-alive one; past it the connection is closed.
    #[arg(long, env = "HTTP_HEADER_TIMEOUT", default_value = "10s", value_parser = parse_positive_duration)]
    pub http_header_timeout: Duration,
    /// Connections open at once at most; past it new ones wait in the backlog
    /// (lowered to fit the open-files limit).
    #[arg(long, env = "HTTP_MAX_CONNECTIONS", default_value_t = http_server::DEFAULT_MAX_CONNECTIONS, value_parser = parse_count)]
    pub http_max_connections: usize,
    /// Requests served on one keep-alive connection before it is closed.
    #[arg(long, env = "HTTP_MAX_REQUESTS_PER_CONNECTION", default_value_t = http_server::DEFAULT_MAX_REQUESTS_PER_CONNECTION, value_parser = parse_requests)]
    pub http_max_requests_per_connection: u64,
}

impl HttpLimitsArgs {
    pub fn limits(&self) -> ConnectionLimits {
        ConnectionLimits {
            header_timeout: self.http_header_timeout,
            max_connections: self.http_max_connections,
            max_requests_per_connection: self.http_max_requests_per_connection,
        }
    }
}

/// `max_attempts` given to jobs enqueued by this process.
#[derive(Debug, Clone, Args)]
pub struct EnqueueArgs {
    /// max_attempts for new jobs.
    #[arg(long, env = "JOB_MAX_ATTEMPTS", default_value_t = crate::outbox::DEFAULT_MAX_ATTEMPTS, value_parser = parse_max_attempts)]
    pub max_attempts: i32,
}

/// The dashboard under `/admin` (`serve`). `Debug` hides the tokens.
#[derive(Clone, Args)]
pub struct AdminArgs {
    /// Enables /admin. A token, or a comma-separated list of `op:TOKEN` (operator) and `ro:TOKEN` (read-only) entries; a bare token is an operator.
    #[arg(long, env = "ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// More read-only tokens, comma-separated.
    #[arg(long, env = "ADMIN_READONLY_TOKEN", hide_env_values = true)]
    pub admin_readonly_token: Option<String>,
    /// Every admin token is read-only: the dashboard shows but never changes.
    #[arg(long, env = "ADMIN_READ_ONLY")]
    pub admin_read_only: bool,
    /// Hide job payloads (they hold customer data) and customer emails in the dashboard.
    #[arg(long, env = "ADMIN_HIDE_PAYLOAD")]
    pub admin_hide_payload: bool,
    /// When the session cookie is Secure: auto (always, except plain http to a loopback address) or always.
    #[arg(long, env = "ADMIN_COOKIE_SECURE", default_value = "auto", value_parser = parse_cookie_secure)]
    pub admin_cookie_secure: crate::api::admin::CookieSecure,
    /// Sender of confirmation emails; its domain completes the Message-IDs shown on an order's timeline.
    #[arg(long, env = "MAIL_FROM")]
    pub mail_from: Option<String>,
}

fn parse_cookie_secure(raw: &str) -> Result<crate::api::admin::CookieSecure, String> {
    raw.parse()
}

impl std::fmt::Debug for AdminArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminArgs")
            .field("admin_token", &self.admin_token.as_ref().map(|_| "***"))
            .field(
                "admin_readonly_token",
                &self.admin_readonly_token.as_ref().map(|_| "***"),
            )
            .field("admin_read_only", &self.admin_read_only)
            .field("admin_hide_payload", &self.admin_hide_payload)
            .field("admin_cookie_secure", &self.admin_cookie_secure)
            .field("mail_from", &self.mail_from)
            .finish()
    }
}

impl AdminArgs {
    /// The dashboard's settings; `None` when no token is set (`/admin` is 404).
    pub fn settings(&self) -> Result<Option<crate::api::admin::AdminSettings>, ConfigError> {
        let tokens = crate::api::admin::parse_admin_tokens(
            self.admin_token.as_deref(),
            self.admin_readonly_token.as_deref(),
        )
        .map_err(|e| ConfigError(format!("ADMIN_TOKEN / ADMIN_READONLY_TOKEN: {e}")))?;
        if tokens.is_empty() {
            return Ok(None);
        }
        let mut settings = crate::api::admin::AdminSettings::new(tokens);
        settings.read_only = self.admin_read_only;
        settings.hide_payload = self.admin_hide_payload;
        settings.cookie_secure = self.admin_cookie_secure;
        settings.mail_domain = self
            .mail_from
            .as_deref()
            .and_then(crate::effects::email::mail_from_domain);
        Ok(Some(settings))
    }
}

/// Everything `relay` reads.
#[derive(Debug, Clone, Args)]
pub struct RelayArgs {
    /// Job kinds this relay claims, comma-separated (default: all).
    #[arg(long, env = "RELAY_KINDS", value_delimiter = ',', value_parser = parse_kind)]
    pub kinds: Vec<EffectKind>,
    /// Effects in flight at most.
    #[arg(long, env = "RELAY_CONCURRENCY", default_value_t = relay::DEFAULT_CONCURRENCY, value_parser = parse_count)]
    pub concurrency: usize,
    /// Database connections of this relay (default: concurrency, at most 64, plus 4).
    #[arg(long, env = "RELAY_POOL_SIZE", value_parser = parse_count)]
    pub pool_size: Option<usize>,
    /// Jobs per claim at most.
    #[arg(long = "batch-size", env = "RELAY_BATCH_SIZE", default_value_t = relay::DEFAULT_BATCH_SIZE, value_parser = parse_count)]
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
}

/// Settings of receipt_pdf (`relay` and `demo`).
#[derive(Debug, Clone, Args)]
pub struct ReceiptArgs {
    /// Font for the characters DejaVu Sans lacks (Chinese, Japanese, Korean):
    /// a .ttf, .otf or .ttc (its first face). Default: Noto Sans CJK from
    /// Debian's fonts-noto-cjk, when installed.
    #[arg(long, env = "RECEIPT_FONT_PATH")]
    pub receipt_font_path: Option<PathBuf>,
}

impl ReceiptArgs {
    /// The receipt settings, fonts loaded now so that problems show at start:
    /// a `RECEIPT_FONT_PATH` that cannot be read is an error; a missing
    /// default font only a warning (CJK then prints as boxes).
    pub fn settings(&self, needed: bool) -> Result<ReceiptSettings, ConfigError> {
        let settings = match (&self.receipt_font_path, needed) {
            (_, false) => return Ok(ReceiptSettings::default()),
            (Some(path), true) => ReceiptSettings::with_cjk_font(path)
                .map_err(|e| ConfigError(format!("RECEIPT_FONT_PATH: {e}")))?,
            (None, true) => ReceiptSettings::default(),
        };
        settings
            .preload()
            .map_err(|e| ConfigError(format!("receipt fonts: {e}")))?;
        Ok(settings)
    }
}

/// Settings of the effects (mail, webhook, links). `Debug` hides the secrets.
#[derive(Clone, Args)]
pub struct EffectArgs {
    /// SMTP transport: smtp://host:port (plain), smtps://user:pass@host or smtp://...?tls=required.
    #[arg(long, env = "SMTP_URL", hide_env_values = true)]
    pub smtp_url: Option<String>,
    /// Sender of the confirmation email, e.g. "Shop <orders@example.com>".
    #[arg(long, env = "MAIL_FROM")]
    pub mail_from: Option<String>,
    /// Order webhook target.
    #[arg(long, env = "WEBHOOK_URL", value_parser = parse_http_url)]
    pub webhook_url: Option<url::Url>,
    /// Signing secrets, space-separated for rotation (`whsec_<base64>` or raw);
    /// the first also keys X-Signature.
    #[arg(long, env = "WEBHOOK_SECRET", hide_env_values = true)]
    pub webhook_secret: Option<String>,
    /// Total time for one webhook call (the connect timeout is 5s).
    #[arg(long, env = "WEBHOOK_TIMEOUT", default_value = "30s", value_parser = parse_positive_duration)]
    pub webhook_timeout: Duration,
    /// Base for links in emails.
    #[arg(long, env = "PUBLIC_BASE_URL", default_value = DEFAULT_PUBLIC_BASE_URL, value_parser = parse_http_url)]
    pub public_base_url: url::Url,
}

impl std::fmt::Debug for EffectArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EffectArgs")
            .field(
                "smtp_url",
                &self
                    .smtp_url
                    .as_deref()
                    .map(crate::effects::email::redact_url),
            )
            .field("mail_from", &self.mail_from)
            .field(
                "webhook_url",
                &self
                    .webhook_url
                    .as_ref()
                    .map(|u| u.origin().ascii_serialization()),
            )
            .field(
                "webhook_secret",
                &self.webhook_secret.as_ref().map(|_| "***"),
            )
            .field("webhook_timeout", &self.webhook_timeout)
            .field("public_base_url", &self.public_base_url.as_str())
            .finish()
    }
}

/// A configuration a relay cannot start with.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

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

    pub fn settings(&self) -> Result<RelaySettings, ConfigError> {
        if self.backoff_base > self.backoff_max {
            return Err(ConfigError(format!(
                "RELAY_BACKOFF_BASE ({}) is larger than RELAY_BACKOFF_MAX ({})",
                humantime::format_duration(self.backoff_base),
                humantime::format_duration(self.backoff_max)
            )));
        }
        if self.lease < Duration::from_secs(1) {
            return Err(ConfigError(format!(
                "RELAY_LEASE ({}) must be at least 1s",
                humantime::format_duration(self.lease)
            )));
        }
        let worker_id = self.worker_id.clone().unwrap_or_else(default_worker_id);
        let mut settings = RelaySettings::new(
            worker_id,
            self.kinds().iter().map(|k| k.as_str().to_owned()).collect(),
        )
        .with_lease(self.lease);
        settings.concurrency = self.concurrency;
        settings.batch_size = self.batch_size;
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

fn parse_job_timeouts(raw: &str) -> Result<JobTimeouts, String> {
    raw.parse()
}

impl EffectArgs {
    /// The mail settings, required when the relay handles confirmation_email.
    pub fn email(&self, needed: bool) -> Result<Option<EmailConfig>, ConfigError> {
        if !needed {
            return Ok(None);
        }
        let smtp_url = self.smtp_url.clone().ok_or_else(|| {
            ConfigError(
                "SMTP_URL is not set, but this relay handles confirmation_email \
                 (set SMTP_URL and MAIL_FROM, or leave confirmation_email out of --kinds)"
                    .into(),
            )
        })?;
        let mail_from = self.mail_from.clone().ok_or_else(|| {
            ConfigError("MAIL_FROM is not set, but this relay handles confirmation_email".into())
        })?;
        Ok(Some(EmailConfig {
            smtp_url,
            mail_from,
            public_base_url: self.public_base_url.to_string(),
        }))
    }

    /// The webhook settings, required when the relay handles order_webhook.
    pub fn webhook(&self, needed: bool) -> Result<Option<WebhookConfig>, ConfigError> {
        if !needed {
            return Ok(None);
        }
        let url = self.webhook_url.clone().ok_or_else(|| {
            ConfigError(
                "WEBHOOK_URL is not set, but this relay handles order_webhook \
                 (set WEBHOOK_URL and WEBHOOK_SECRET, or leave order_webhook out of --kinds)"
                    .into(),
            )
        })?;
        let secret = self
            .webhook_secret
            .clone()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                ConfigError(
                    "WEBHOOK_SECRET is not set, but this relay handles order_webhook".into(),
                )
            })?;
        crate::effects::signature::Secrets::parse(&secret)
            .map_err(|e| ConfigError(format!("WEBHOOK_SECRET: {e}")))?;
        Ok(Some(WebhookConfig {
            url,
            secret,
            timeout: self.webhook_timeout,
        }))
    }
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
    use super::*;

    #[test]
    fn durations_are_human() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_positive_duration("0s").is_err());
    }

    #[test]
    fn effect_settings_print_without_their_secrets() {
        let args = EffectArgs {
            smtp_url: Some("smtps://mailer:pw-hunter2@smtp.example.com".into()),
            mail_from: Some("Shop <orders@example.com>".into()),
            webhook_url: parse_http_url("https://hooks.example.com/t/tok-abc123").ok(),
            webhook_secret: Some("whsec-hunter2".into()),
            webhook_timeout: DEFAULT_WEBHOOK_TIMEOUT,
            public_base_url: parse_http_url(DEFAULT_PUBLIC_BASE_URL).expect("default URL"),
        };
        let shown = format!("{args:?}");
        for secret in ["hunter2", "tok-abc123"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(shown.contains("smtp.example.com"), "{shown}");
    }

    fn relay_args(args: &[&str]) -> Result<RelayArgs, clap::Error> {
        #[derive(clap::Parser, Debug)]
        struct Cli {
            #[command(flatten)]
            relay: RelayArgs,
        }
        use clap::Parser as _;
        let mut argv = vec!["relay"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).map(|cli| cli.relay)
    }

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
    fn a_whsec_secret_that_is_not_base64_is_refused_without_printing_it() {
        let args = relay_args(&[
            "--webhook-url",
            "https://hooks.example.com/x",
            "--webhook-secret",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw whsec_hunter2!!",
        ])
        .expect("parses");
        let error = args.effects.webhook(true).expect_err("refused");
        assert!(
            error.0.starts_with("WEBHOOK_SECRET: secret 2 of 2"),
            "{error}"
        );
        assert!(!error.0.contains("hunter2"), "{error}");
        assert!(!error.0.contains("MfKQ9r8G"), "{error}");
    }

    #[test]
    fn an_unreadable_receipt_font_path_is_an_error_naming_the_variable() {
        let args = relay_args(&["--receipt-font-path", "/nonexistent/font.ttc"]).expect("parses");
        let error = args.receipt.settings(true).expect_err("refused");
        assert!(
            error
                .0
                .starts_with("RECEIPT_FONT_PATH: cannot read /nonexistent/font.ttc"),
            "{error}"
        );
        assert!(
            args.receipt.settings(false).is_ok(),
            "not read when not needed"
        );
        let not_a_font = relay_args(&["--receipt-font-path", "Cargo.toml"]).expect("parses");
        let error = not_a_font.receipt.settings(true).expect_err("refused");
        assert!(error.0.contains("Cargo.toml is not a font"), "{error}");
    }

    #[test]
    fn an_explicit_receipt_font_path_is_the_font_receipts_use() {
        let path = crate::effects::receipt::DEFAULT_CJK_FONT_PATH;
        let args = relay_args(&["--receipt-font-path", path]).expect("parses");
        let settings = args
            .receipt
            .settings(true)
            .expect("fonts-noto-cjk is installed");
        assert_eq!(
            settings.preload().expect("loaded"),
            Some(std::path::Path::new(path))
        );
    }

    #[test]
    fn default_worker_ids_differ_between_processes_with_the_same_hostname_and_pid() {
        assert_ne!(default_worker_id(), default_worker_id());
    }

    #[test]
    fn urls_are_checked_for_their_scheme() {
        assert!(parse_database_url("postgres://u@localhost/db").is_ok());
        assert!(parse_database_url("mysql://u@localhost/db").is_err());
        assert!(parse_database_url("not a url").is_err());
        assert!(parse_http_url("https://hooks.example.com/x").is_ok());
        assert!(parse_http_url("ftp://example.com").is_err());
    }
}
