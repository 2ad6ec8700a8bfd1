//! What the dashboard under `/admin` reads from flags and the environment.

use clap::Args;

use super::ConfigError;
use super::parse::parse_cookie_secure;

fn parse_trusted_proxies(
    raw: &str,
) -> Result<crate::http_server::client_addr::TrustedProxies, String> {
    crate::http_server::client_addr::TrustedProxies::parse(raw)
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
    pub admin_cookie_secure: super::dashboard::CookieSecure,
    /// Proxies in front of serve, as IPs or CIDR networks (comma-separated): behind them, the client address the failed-login limit counts is read from X-Forwarded-For.
    #[arg(long, env = "TRUSTED_PROXIES", value_parser = parse_trusted_proxies)]
    pub trusted_proxies: Option<crate::http_server::client_addr::TrustedProxies>,
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
        settings.trusted_proxies = self.trusted_proxies.clone().unwrap_or_default();
        settings.mail_domain = self
            .mail_from
            .as_deref()
            .and_then(crate::effects::email::mail_from_domain);
        Ok(Some(settings))
    }
}
