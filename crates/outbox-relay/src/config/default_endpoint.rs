//! `WEBHOOK_URL` / `WEBHOOK_SECRET` as the endpoint `default`, for the
//! commands that write it at start (`migrate`, `serve`; `relay` reads the same
//! variables through its effect settings).

use clap::Args;

use super::ConfigError;
use super::parse::parse_webhook_url;

/// The endpoint `default`, from the environment. `Debug` hides the secret.
#[derive(Clone, Args)]
pub struct DefaultEndpointArgs {
    /// Creates or updates the endpoint `default` (every event) with this URL.
    #[arg(long, env = "WEBHOOK_URL", value_parser = parse_webhook_url)]
    pub webhook_url: Option<url::Url>,
    /// The signing secrets of `default`, space-separated for rotation.
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
            .finish()
    }
}

impl DefaultEndpointArgs {
    /// The URL and secret of `default`, checked; none without `WEBHOOK_URL`.
    pub fn checked(&self) -> Result<Option<(url::Url, String)>, ConfigError> {
        checked(
            self.webhook_url.as_ref(),
            self.webhook_secret.as_deref(),
            self.webhook_allow_http,
        )
    }
}

/// `url` and `secret` as `default`'s: a URL needs a secret that parses, and
/// an http:// one needs `allow_http` (`WEBHOOK_ALLOW_HTTP`).
pub fn checked(
    url: Option<&url::Url>,
    secret: Option<&str>,
    allow_http: bool,
) -> Result<Option<(url::Url, String)>, ConfigError> {
    let Some(url) = url else {
        return Ok(None);
    };
    let secret = secret.filter(|s| !s.trim().is_empty()).ok_or_else(|| {
        ConfigError(
            "WEBHOOK_SECRET is not set, but WEBHOOK_URL is (the endpoint `default` needs both)"
                .into(),
        )
    })?;
    super::parse::refuse_placeholder("WEBHOOK_SECRET", secret)?;
    crate::effects::signature::Secrets::parse(secret)
        .map_err(|e| ConfigError(format!("WEBHOOK_SECRET: {e}")))?;
    if url.scheme() == "http" && !allow_http {
        return Err(ConfigError(format!(
            "WEBHOOK_URL {}: http:// sends events and signatures in the clear; use https://, \
             or set WEBHOOK_ALLOW_HTTP=true",
            url.origin().ascii_serialization()
        )));
    }
    Ok(Some((url.clone(), secret.trim().to_owned())))
}

/// Writes `default` (if configured) over `database_url`, on a blocking thread.
pub async fn write_default(
    database_url: &str,
    default: Option<(url::Url, String)>,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let Some((url, secret)) = default else {
        return Ok(());
    };
    let database_url = database_url.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        use diesel::Connection as _;
        let mut conn = diesel::PgConnection::establish(&database_url)
            .context("connecting to write the endpoint `default`")?;
        let id = crate::endpoints::target::upsert_default(&mut conn, &url, &secret)
            .context("writing the endpoint `default` from WEBHOOK_URL")?;
        tracing::info!(endpoint_id = id, url = %url.origin().ascii_serialization(), "endpoint `default` from WEBHOOK_URL");
        Ok(())
    })
    .await?
}
