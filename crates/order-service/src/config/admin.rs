//! What the dashboard under `/admin` reads from flags and the environment.

use clap::Args;

use super::ConfigError;
use super::DEFAULT_PUBLIC_BASE_URL;
use super::parse::{parse_cookie_secure, parse_http_url, parse_positive_duration};
use crate::client_addr::TrustedProxies;

fn parse_trusted_proxies(raw: &str) -> Result<TrustedProxies, String> {
    TrustedProxies::parse(raw)
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
    /// When the session cookie is Secure (and named with the __Host- prefix): auto (always, except when PUBLIC_BASE_URL is plain http on a loopback host) or always. A request's Host or X-Forwarded-Proto never decides.
    #[arg(long, env = "ADMIN_COOKIE_SECURE", default_value = "auto", value_parser = parse_cookie_secure)]
    pub admin_cookie_secure: super::dashboard::CookieSecure,
    /// Where browsers reach this service (the base of the links in emails, on the relays): decides the session cookie's Secure flag under ADMIN_COOKIE_SECURE=auto.
    #[arg(long, env = "PUBLIC_BASE_URL", default_value = DEFAULT_PUBLIC_BASE_URL, value_parser = parse_http_url)]
    pub public_base_url: url::Url,
    /// A dashboard session unused for this long is refused (the operator logs in again); sessions also end 12 hours after their login.
    #[arg(long, env = "ADMIN_SESSION_IDLE", default_value = "30m", value_parser = parse_positive_duration)]
    pub admin_session_idle: std::time::Duration,
    /// Proxies in front of serve, as IPs or CIDR networks (comma-separated): behind them, the client address that the per-address limits and the failed-login limit count is read from X-Forwarded-For, and they are not capped in connections.
    #[arg(long, env = "TRUSTED_PROXIES", value_parser = parse_trusted_proxies)]
    pub trusted_proxies: Option<TrustedProxies>,
    /// Sender of confirmation emails; its domain completes the Message-IDs shown on an order's timeline.
    #[arg(long, env = "MAIL_FROM")]
    pub mail_from: Option<String>,
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
            .field("public_base_url", &self.public_base_url.as_str())
            .field("admin_session_idle", &self.admin_session_idle)
            .field("trusted_proxies", &self.trusted_proxies)
            .field("mail_from", &self.mail_from)
            .finish()
    }
}

impl AdminArgs {
    /// The dashboard's settings; `None` when no token is set (`/admin` is 404).
    pub fn settings(&self) -> Result<Option<super::dashboard::AdminSettings>, ConfigError> {
        let tokens = super::dashboard::parse_admin_tokens(
            self.admin_token.as_deref(),
            self.admin_readonly_token.as_deref(),
        )
        // The error names ADMIN_TOKEN or ADMIN_READONLY_TOKEN itself.
        .map_err(ConfigError)?;
        if tokens.is_empty() {
            return Ok(None);
        }
        let mut settings = super::dashboard::AdminSettings::new(tokens);
        settings.read_only = self.admin_read_only;
        settings.hide_payload = self.admin_hide_payload;
        settings.cookie_secure = self.admin_cookie_secure;
        settings.public_base_url = self.public_base_url.clone();
        settings.session_idle = self.admin_session_idle;
        settings.trusted_proxies = self.trusted_proxies.clone().unwrap_or_default();
        settings.mail_domain = self.mail_from.as_deref().and_then(mail_from_domain);
        Ok(Some(settings))
    }
}

/// The domain of a `MAIL_FROM` mailbox (`Shop <orders@shop.example>`), if it is one.
pub fn mail_from_domain(mail_from: &str) -> Option<String> {
    mail_from
        .parse::<lettre::message::Mailbox>()
        .ok()
        .map(|m| m.email.domain().to_owned())
}
