//! `WEBHOOK_URL` / `WEBHOOK_SECRET` as the endpoint `default`, which
//! `migrate`, `serve` and `relay` write at start (the commands check and
//! write it: checking the secret is the signatures' own).

use clap::Args;

use super::parse::parse_webhook_url;

/// The endpoint `default`, from the environment. `Debug` hides the secret.
#[derive(Clone, Args)]
pub struct DefaultEndpointArgs {
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
}

impl std::fmt::Debug for DefaultEndpointArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DefaultEndpointArgs")
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
            .field("webhook_allow_http", &self.webhook_allow_http)
            .finish()
    }
}
