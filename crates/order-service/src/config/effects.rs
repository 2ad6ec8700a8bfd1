//! What the effects read (mail, webhook, links, receipt fonts). What each
//! effect makes of it, checked against the kinds a relay handles, is the
//! effects' own (`effects::settings`).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::parse::{parse_http_url, parse_positive_duration, redacted_proxy};
use super::{DEFAULT_PUBLIC_BASE_URL, DefaultEndpointArgs};

/// Settings of receipt_pdf (`relay` and `demo`).
#[derive(Debug, Clone, Args)]
pub struct ReceiptArgs {
    /// Font for the characters DejaVu Sans lacks (Chinese, Japanese, Korean):
    /// a .ttf, .otf or .ttc (its first face). Default: Noto Sans CJK from
    /// Debian's fonts-noto-cjk, when installed.
    #[arg(long, env = "RECEIPT_FONT_PATH")]
    pub receipt_font_path: Option<PathBuf>,
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
    // WEBHOOK_URL, WEBHOOK_SECRET, WEBHOOK_ALLOW_HTTP: the endpoint
    // `default`, which the relay writes at start whatever its kinds.
    #[command(flatten)]
    pub default_endpoint: DefaultEndpointArgs,
    /// Total time for one webhook call (the connect timeout is 5s).
    #[arg(long, env = "WEBHOOK_TIMEOUT", default_value = "30s", value_parser = parse_positive_duration)]
    pub webhook_timeout: Duration,
    /// Deliver webhooks, and connect to NATS servers, on loopback, private and
    /// link-local addresses too; off, a URL whose host is or resolves to one
    /// is refused at connect time.
    #[arg(long, env = "WEBHOOK_ALLOW_PRIVATE", default_value_t = false, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub webhook_allow_private: bool,
    /// Send every webhook call through this HTTP proxy (http:// or https://;
    /// `user:password@` allowed, never logged). The receiver's host is still
    /// checked against WEBHOOK_ALLOW_PRIVATE, before the call is handed to the
    /// proxy. Environment proxies (HTTP_PROXY, ...) are never used.
    #[arg(long, env = "WEBHOOK_PROXY", hide_env_values = true)]
    pub webhook_proxy: Option<String>,
    /// An endpoint whose every delivery has failed this long is disabled
    /// (`disabled_reason = 'failing'`); its deliveries wait until it is enabled.
    #[arg(long, env = "ENDPOINT_DISABLE_AFTER", default_value = "5d", value_parser = parse_positive_duration)]
    pub endpoint_disable_after: Duration,
    /// An endpoint whose every delivery has failed this long, with no success
    /// in between, trips its breaker: it is probed one delivery at a time.
    #[arg(long, env = "ENDPOINT_TRIP_AFTER", default_value = "30s", value_parser = parse_positive_duration)]
    pub endpoint_trip_after: Duration,
    /// The longest wait between two probes of a tripped endpoint (the wait
    /// grows with how long it has been failing, up to this).
    #[arg(long, env = "ENDPOINT_PROBE_MAX", default_value = "5m", value_parser = parse_positive_duration)]
    pub endpoint_probe_max: Duration,
    /// Rows of `delivery_attempts` older than this are deleted by the relays.
    #[arg(long, env = "DELIVERY_ATTEMPTS_RETENTION", default_value = "30d", value_parser = parse_positive_duration)]
    pub delivery_attempts_retention: Duration,
    /// Rows of `admin_audit` older than this are deleted by the relays.
    #[arg(long, env = "ADMIN_AUDIT_RETENTION", default_value = "400d", value_parser = parse_positive_duration)]
    pub admin_audit_retention: Duration,
    /// Credentials file for NATS endpoints without credentials of their own
    /// (a user JWT and its nkey seed, as `nsc` writes them); without it, their
    /// connections carry none.
    #[arg(long, env = "NATS_CREDENTIALS")]
    pub nats_credentials: Option<PathBuf>,
    /// Base for links in emails.
    #[arg(long, env = "PUBLIC_BASE_URL", default_value = DEFAULT_PUBLIC_BASE_URL, value_parser = parse_http_url)]
    pub public_base_url: url::Url,
}

impl std::fmt::Debug for EffectArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EffectArgs")
            .field(
                "smtp_url",
                &self.smtp_url.as_deref().map(outbox_core::db::redact_url),
            )
            .field("mail_from", &self.mail_from)
            .field("default_endpoint", &self.default_endpoint)
            .field("webhook_timeout", &self.webhook_timeout)
            .field(
                "webhook_proxy",
                &self.webhook_proxy.as_deref().map(redacted_proxy),
            )
            .field("endpoint_disable_after", &self.endpoint_disable_after)
            .field("endpoint_trip_after", &self.endpoint_trip_after)
            .field("endpoint_probe_max", &self.endpoint_probe_max)
            .field(
                "delivery_attempts_retention",
                &self.delivery_attempts_retention,
            )
            .field("admin_audit_retention", &self.admin_audit_retention)
            .field("nats_credentials", &self.nats_credentials)
            .field("public_base_url", &self.public_base_url.as_str())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::super::relay_args;
    use super::*;

    #[test]
    fn effect_settings_print_without_their_secrets() {
        let args = relay_args(&[
            "--smtp-url",
            "smtps://mailer:pw-hunter2@smtp.example.com",
            "--webhook-url",
            "https://hooks.example.com/t/tok-abc123",
            "--webhook-secret",
            "whsec-hunter2",
            "--webhook-proxy",
            "http://relay:pw-hunter2@proxy.internal:3128",
        ])
        .expect("parses");
        let shown = format!("{:?}", args.effects);
        for secret in ["hunter2", "tok-abc123"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(shown.contains("smtp.example.com"), "{shown}");
        assert!(shown.contains("http://***@proxy.internal:3128"), "{shown}");
        assert!(shown.contains("https://hooks.example.com"), "{shown}");
    }

    #[test]
    fn webhook_url_follows_the_endpoint_url_rules() {
        let error = relay_args(&["--webhook-url", "https://ops:hunter2@hooks.example.com/x"])
            .expect_err("credentials refused");
        assert!(error.to_string().contains("credentials"), "{error}");
        assert!(relay_args(&["--webhook-url", "ftp://hooks.example.com/x"]).is_err());
        let error = relay_args(&["--webhook-url", "nats://127.0.0.1:4222"]).expect_err("nats");
        assert!(error.to_string().contains("endpoints add"), "{error}");
        let https = relay_args(&["--webhook-url", "https://hooks.example.com/x"]).expect("parses");
        assert_eq!(
            https
                .effects
                .default_endpoint
                .webhook_url
                .as_ref()
                .map(url::Url::as_str),
            Some("https://hooks.example.com/x")
        );
    }

    #[test]
    fn the_breaker_trips_after_thirty_seconds_unless_told_otherwise() {
        let default = relay_args(&[]).expect("parses").effects;
        assert_eq!(default.endpoint_trip_after, Duration::from_secs(30));
        assert_eq!(default.endpoint_probe_max, Duration::from_secs(300));
        assert_eq!(
            default.endpoint_disable_after,
            Duration::from_secs(5 * 86400)
        );
        let short = relay_args(&[
            "--endpoint-trip-after",
            "500ms",
            "--endpoint-probe-max",
            "1s",
        ])
        .expect("parses")
        .effects;
        assert_eq!(short.endpoint_trip_after, Duration::from_millis(500));
        assert_eq!(short.endpoint_probe_max, Duration::from_secs(1));
        assert!(relay_args(&["--endpoint-trip-after", "0s"]).is_err());
    }
}
