//! The endpoint `default` from `WEBHOOK_URL` / `WEBHOOK_SECRET`: checked
//! before anything else by `migrate`, `serve` and `relay`, written by each
//! once the database is migrated.

use anyhow::Context as _;

use crate::config::{ConfigError, DefaultEndpointArgs, refuse_placeholder};
use crate::effects::signature::Secrets;
use crate::endpoints::store::StoreError;
use crate::sealed::Keyring;

/// The URL and secret of `default`, checked; none without `WEBHOOK_URL`. A
/// URL needs a secret that parses, and an http:// one needs
/// `WEBHOOK_ALLOW_HTTP`.
pub fn checked(args: &DefaultEndpointArgs) -> Result<Option<(url::Url, String)>, ConfigError> {
    let Some(url) = &args.webhook_url else {
        return Ok(None);
    };
    let secret = args
        .webhook_secret
        .as_deref()
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| {
            ConfigError(
                "WEBHOOK_SECRET is not set, but WEBHOOK_URL is (the endpoint `default` needs both)"
                    .into(),
            )
        })?;
    refuse_placeholder("WEBHOOK_SECRET", secret)?;
    Secrets::parse(secret).map_err(|e| ConfigError(format!("WEBHOOK_SECRET: {e}")))?;
    if url.scheme() == "http" && !args.webhook_allow_http {
        return Err(ConfigError(format!(
            "WEBHOOK_URL {}: http:// sends events and signatures in the clear; use https://, \
             or set WEBHOOK_ALLOW_HTTP=true",
            url.origin().ascii_serialization()
        )));
    }
    Ok(Some((url.clone(), secret.trim().to_owned())))
}

/// Writes `default` (if configured) over `database_url`, on a blocking thread,
/// its secret sealed when `secrets` has a key.
pub async fn write(
    database_url: &str,
    default: Option<(url::Url, String)>,
    secrets: &Keyring,
) -> anyhow::Result<()> {
    let Some((url, secret)) = default else {
        return Ok(());
    };
    let database_url = database_url.to_owned();
    let secrets = secrets.clone();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        use diesel::Connection as _;
        let mut conn = diesel::PgConnection::establish(&database_url)
            .context("connecting to write the endpoint `default`")?;
        let id = crate::endpoints::target::upsert_default(&mut conn, &url, &secret, &secrets)
            .map_err(|e| match e {
                StoreError::SealedWithoutKey(ids) => ConfigError(format!(
                    "WEBHOOK_URL and WEBHOOK_SECRET would write the secret of the endpoint \
                     `default` in plaintext, but this database holds sealed secrets (key \
                     {ids}) and SECRETS_KEY is not set: set SECRETS_KEY for this process too, \
                     or unset WEBHOOK_URL and WEBHOOK_SECRET; the stored secret is left as it is"
                ))
                .into(),
                other => anyhow::Error::from(other)
                    .context("writing the endpoint `default` from WEBHOOK_URL"),
            })?;
        tracing::info!(endpoint_id = id, url = %url.origin().ascii_serialization(), "endpoint `default` from WEBHOOK_URL");
        Ok(())
    })
    .await?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_http_url;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn args(url: &str, secret: &str, allow_http: bool) -> DefaultEndpointArgs {
        DefaultEndpointArgs {
            webhook_url: Some(parse_http_url(url).expect("a URL")),
            webhook_secret: Some(secret.to_owned()),
            webhook_allow_http: allow_http,
        }
    }

    #[test]
    fn an_http_webhook_url_needs_allowing() {
        let error = checked(&args("http://hooks.example.com/x", SECRET, false))
            .expect_err("http needs allowing");
        assert!(error.0.contains("WEBHOOK_ALLOW_HTTP"), "{error}");
        let allowed = checked(&args("http://hooks.example.com/x", SECRET, true)).expect("allowed");
        assert!(allowed.is_some());
        let https = checked(&args("https://hooks.example.com/x", SECRET, false)).expect("https");
        assert_eq!(
            https.map(|(url, secret)| (url.to_string(), secret)),
            Some(("https://hooks.example.com/x".to_owned(), SECRET.to_owned()))
        );
        let none = DefaultEndpointArgs {
            webhook_url: None,
            webhook_secret: None,
            webhook_allow_http: false,
        };
        assert!(checked(&none).expect("nothing to check").is_none());
    }

    #[test]
    fn a_placeholder_webhook_secret_is_refused_naming_the_variable() {
        let error = checked(&args(
            "https://hooks.example.com/x",
            "change-me-in-production",
            false,
        ))
        .expect_err("refused");
        assert!(
            error.0.starts_with("WEBHOOK_SECRET is a placeholder"),
            "{error}"
        );
    }

    #[test]
    fn a_whsec_secret_that_is_not_base64_is_refused_without_printing_it() {
        let error = checked(&args(
            "https://hooks.example.com/x",
            &format!("{SECRET} whsec_hunter2!!"),
            false,
        ))
        .expect_err("refused");
        assert!(
            error.0.starts_with("WEBHOOK_SECRET: secret 2 of 2"),
            "{error}"
        );
        assert!(!error.0.contains("hunter2"), "{error}");
        assert!(!error.0.contains("MfKQ9r8G"), "{error}");
    }
}
