//! What the effects read (mail, webhook, links, receipt fonts), checked
//! against the kinds a relay handles.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::parse::{parse_http_url, parse_positive_duration, parse_webhook_url};
use super::{ConfigError, DEFAULT_PUBLIC_BASE_URL};
use crate::effects::email::EmailConfig;
use crate::effects::nats::{NatsConnections, NatsCredentials};
use crate::effects::receipt::ReceiptSettings;
use crate::effects::webhook::DeliveryOptions;

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
    /// Creates or updates the endpoint `default` (every event) with this URL;
    /// deliveries go to the endpoint rows, `default` among them.
    #[arg(long, env = "WEBHOOK_URL", value_parser = parse_webhook_url)]
    pub webhook_url: Option<url::Url>,
    /// The signing secrets of `default`, space-separated for rotation
    /// (`whsec_<base64>` or raw); the first also keys X-Signature.
    #[arg(long, env = "WEBHOOK_SECRET", hide_env_values = true)]
    pub webhook_secret: Option<String>,
    /// Allow an http:// `WEBHOOK_URL`: events and signatures go in the clear.
    #[arg(long, env = "WEBHOOK_ALLOW_HTTP", default_value_t = false, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub webhook_allow_http: bool,
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
                &self.smtp_url.as_deref().map(crate::db::redact_url),
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
            .field(
                "webhook_proxy",
                &self
                    .webhook_proxy
                    .as_deref()
                    .map(crate::effects::webhook::redacted_proxy),
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
            // The caller's, from LinkArgs.
            receipt_links: None,
        }))
    }

    /// The NATS connections of a relay that publishes (with `NATS_CREDENTIALS`,
    /// read now so that a bad file fails the start, naming the variable).
    pub async fn nats(&self) -> Result<NatsConnections, ConfigError> {
        let credentials = match &self.nats_credentials {
            Some(path) => Some(NatsCredentials::load(path).await.map_err(ConfigError)?),
            None => None,
        };
        Ok(NatsConnections::new(
            credentials,
            self.webhook_allow_private,
        ))
    }

    /// What a relay needs to deliver to endpoints (order_webhook,
    /// endpoint_notice): no URL of its own, since every endpoint row has one.
    /// `WEBHOOK_URL` is not needed: it only makes the endpoint `default`
    /// ([`Self::default_endpoint`]).
    pub fn webhook(&self, needed: bool) -> Result<Option<DeliveryOptions>, ConfigError> {
        if !needed {
            return Ok(None);
        }
        let proxy = self
            .webhook_proxy
            .as_deref()
            .map(|raw| {
                crate::effects::webhook::parse_proxy(raw).map_err(|e| {
                    ConfigError(format!(
                        "WEBHOOK_PROXY {}: {e}",
                        crate::effects::webhook::redacted_proxy(raw)
                    ))
                })
            })
            .transpose()?;
        Ok(Some(DeliveryOptions {
            timeout: self.webhook_timeout,
            allow_private: self.webhook_allow_private,
            proxy,
        }))
    }

    /// The endpoints' breaker (`ENDPOINT_DISABLE_AFTER`, `ENDPOINT_TRIP_AFTER`,
    /// `ENDPOINT_PROBE_MAX`).
    pub fn breaker(&self) -> crate::endpoints::breaker::Breaker {
        crate::endpoints::breaker::Breaker {
            disable_after: self.endpoint_disable_after,
            trip_after: self.endpoint_trip_after,
            probe_max: self.endpoint_probe_max,
        }
    }

    /// How long the relays keep the attempt and audit logs.
    pub fn retention(&self) -> crate::endpoints::upkeep::Retention {
        crate::endpoints::upkeep::Retention {
            attempts: self.delivery_attempts_retention,
            audit: self.admin_audit_retention,
        }
    }

    /// The endpoint `default` from `WEBHOOK_URL` / `WEBHOOK_SECRET`, checked
    /// whenever they are given (the relay writes it whatever its kinds, as
    /// `migrate` and `serve` do); none without `WEBHOOK_URL`.
    pub fn default_endpoint(&self) -> Result<Option<(url::Url, String)>, ConfigError> {
        super::default_endpoint::checked(
            self.webhook_url.as_ref(),
            self.webhook_secret.as_deref(),
            self.webhook_allow_http,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::relay_args;
    use super::*;
    use crate::config::DEFAULT_WEBHOOK_TIMEOUT;

    #[test]
    fn effect_settings_print_without_their_secrets() {
        let args = EffectArgs {
            smtp_url: Some("smtps://mailer:pw-hunter2@smtp.example.com".into()),
            mail_from: Some("Shop <orders@example.com>".into()),
            webhook_url: parse_http_url("https://hooks.example.com/t/tok-abc123").ok(),
            webhook_secret: Some("whsec-hunter2".into()),
            webhook_allow_http: false,
            webhook_timeout: DEFAULT_WEBHOOK_TIMEOUT,
            webhook_allow_private: false,
            webhook_proxy: Some("http://relay:pw-hunter2@proxy.internal:3128".into()),
            endpoint_disable_after: crate::endpoints::breaker::DEFAULT_DISABLE_AFTER,
            endpoint_trip_after: crate::endpoints::breaker::DEFAULT_TRIP_AFTER,
            endpoint_probe_max: crate::endpoints::breaker::DEFAULT_PROBE_MAX,
            delivery_attempts_retention: crate::endpoints::upkeep::DEFAULT_ATTEMPTS_RETENTION,
            admin_audit_retention: crate::endpoints::upkeep::DEFAULT_AUDIT_RETENTION,
            nats_credentials: None,
            public_base_url: parse_http_url(DEFAULT_PUBLIC_BASE_URL).expect("default URL"),
        };
        let shown = format!("{args:?}");
        for secret in ["hunter2", "tok-abc123"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(shown.contains("smtp.example.com"), "{shown}");
        assert!(shown.contains("http://***@proxy.internal:3128"), "{shown}");
    }

    #[test]
    fn webhook_url_follows_the_endpoint_url_rules() {
        let error = relay_args(&["--webhook-url", "https://ops:hunter2@hooks.example.com/x"])
            .expect_err("credentials refused");
        assert!(error.to_string().contains("credentials"), "{error}");
        assert!(relay_args(&["--webhook-url", "ftp://hooks.example.com/x"]).is_err());
        let secret = ["--webhook-secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"];
        let plain = relay_args(
            &[
                &["--webhook-url", "http://hooks.example.com/x"][..],
                &secret[..],
            ]
            .concat(),
        )
        .expect("parses");
        let error = plain
            .effects
            .default_endpoint()
            .expect_err("http needs allowing");
        assert!(error.0.contains("WEBHOOK_ALLOW_HTTP"), "{error}");
        let allowed = relay_args(
            &[
                &["--webhook-url", "http://hooks.example.com/x"][..],
                &secret[..],
                &["--webhook-allow-http", "true"][..],
            ]
            .concat(),
        )
        .expect("parses");
        assert!(
            allowed
                .effects
                .default_endpoint()
                .expect("allowed")
                .is_some()
        );
        let https = relay_args(
            &[
                &["--webhook-url", "https://hooks.example.com/x"][..],
                &secret[..],
            ]
            .concat(),
        )
        .expect("parses");
        assert!(https.effects.default_endpoint().expect("https").is_some());
    }

    #[test]
    fn a_placeholder_webhook_secret_is_refused_naming_the_variable() {
        let args = relay_args(&[
            "--webhook-url",
            "https://hooks.example.com/x",
            "--webhook-secret",
            "change-me-in-production",
        ])
        .expect("parses");
        let error = args.effects.default_endpoint().expect_err("refused");
        assert!(
            error.0.starts_with("WEBHOOK_SECRET is a placeholder"),
            "{error}"
        );
    }

    #[test]
    fn the_breaker_trips_after_thirty_seconds_unless_told_otherwise() {
        let default = relay_args(&[]).expect("parses").effects.breaker();
        assert_eq!(default.trip_after, Duration::from_secs(30));
        assert_eq!(default.probe_max, Duration::from_secs(300));
        let short = relay_args(&[
            "--endpoint-trip-after",
            "500ms",
            "--endpoint-probe-max",
            "1s",
        ])
        .expect("parses")
        .effects
        .breaker();
        assert_eq!(short.trip_after, Duration::from_millis(500));
        assert_eq!(short.probe_max, Duration::from_secs(1));
        assert!(relay_args(&["--endpoint-trip-after", "0s"]).is_err());
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
        let error = args.effects.default_endpoint().expect_err("refused");
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
        let path = crate::effects::receipt::TEST_CJK_FONT;
        let args = relay_args(&["--receipt-font-path", path]).expect("parses");
        let settings = args.receipt.settings(true).expect("the test font loads");
        assert_eq!(
            settings.preload().expect("loaded"),
            Some(std::path::Path::new(path))
        );
    }
}
