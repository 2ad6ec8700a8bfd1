//! What signs the customer links in emails (`LINK_SIGNING_KEY`,
//! `LINK_SIGNING_KEYS_PREVIOUS`, `RECEIPT_LINK_TTL`), read by `serve` (to check them) and by a relay that
//! sends emails (to write them).

use std::time::Duration;

use clap::Args;

use super::ConfigError;
use super::parse::parse_positive_duration;
use crate::links::ReceiptLinks;

/// The receipt links' key and lifetime. `Debug` hides the key.
#[derive(Clone, Args)]
pub struct LinkArgs {
    /// Key of the HMAC that signs receipt links in emails: at least 32 bytes
    /// (`openssl rand -base64 32`); the same on `serve` and every relay.
    #[arg(long, env = "LINK_SIGNING_KEY", hide_env_values = true)]
    pub link_signing_key: Option<String>,
    /// Older link keys, comma-separated, during a rotation: links they signed
    /// keep working (until they expire); nothing new is signed with them.
    #[arg(long, env = "LINK_SIGNING_KEYS_PREVIOUS", hide_env_values = true)]
    pub link_signing_keys_previous: Option<String>,
    /// How long a receipt link in an email works.
    #[arg(long, env = "RECEIPT_LINK_TTL", default_value = "30d", value_parser = parse_positive_duration)]
    pub receipt_link_ttl: Duration,
}

impl std::fmt::Debug for LinkArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkArgs")
            .field(
                "link_signing_key",
                &self.link_signing_key.as_ref().map(|_| "***"),
            )
            .field(
                "link_signing_keys_previous",
                &self.link_signing_keys_previous.as_ref().map(|_| "***"),
            )
            .field("receipt_link_ttl", &self.receipt_link_ttl)
            .finish()
    }
}

impl LinkArgs {
    /// The link signer. `required` is whether this process cannot work
    /// without one: `serve` and a relay that sends emails, unless the API's
    /// keys are turned off (`API_AUTH=none`, local work), when the receipt
    /// route is open and emails carry plain links. A key that is set is
    /// checked either way: an empty or short one is a mistake to report.
    pub fn receipt_links(
        &self,
        required: bool,
        needed_by: &str,
    ) -> Result<Option<ReceiptLinks>, ConfigError> {
        match self.link_signing_key.as_deref() {
            Some(key) => {
                super::parse::refuse_placeholder("LINK_SIGNING_KEY", key)?;
                let links = ReceiptLinks::new(key.as_bytes(), self.receipt_link_ttl)
                    .map_err(|e| ConfigError(format!("LINK_SIGNING_KEY {e}")))?;
                let previous: Vec<&str> = self
                    .link_signing_keys_previous
                    .as_deref()
                    .unwrap_or_default()
                    .split(',')
                    .map(str::trim)
                    .filter(|k| !k.is_empty())
                    .collect();
                for old in &previous {
                    super::parse::refuse_placeholder("LINK_SIGNING_KEYS_PREVIOUS", old)?;
                }
                links
                    .with_previous(previous.iter().map(|k| k.as_bytes()))
                    .map(Some)
                    .map_err(|e| ConfigError(format!("LINK_SIGNING_KEYS_PREVIOUS: {e}")))
            }
            None if required => Err(ConfigError(format!(
                "LINK_SIGNING_KEY is not set, but {needed_by} needs it to sign or check \
                 receipt links (at least 32 bytes, e.g. `openssl rand -base64 32`; \
                 API_AUTH=none turns links and keys off for local work)"
            ))),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(key: Option<&str>) -> LinkArgs {
        LinkArgs {
            link_signing_key: key.map(str::to_owned),
            link_signing_keys_previous: None,
            receipt_link_ttl: crate::links::DEFAULT_RECEIPT_LINK_TTL,
        }
    }

    #[test]
    fn a_missing_key_is_refused_only_where_it_is_required() {
        let error = args(None)
            .receipt_links(true, "serve")
            .expect_err("refused");
        assert!(
            error.0.starts_with("LINK_SIGNING_KEY is not set"),
            "{error}"
        );
        assert!(
            args(None)
                .receipt_links(false, "serve")
                .expect("ok")
                .is_none()
        );
    }

    #[test]
    fn the_placeholder_keys_of_the_examples_are_refused_naming_the_variable() {
        for key in [
            "local-compose-only-link-key-change-me-0123",
            "local-only-link-key-change-me-0123456789",
            "PLACEHOLDER-link-signing-key-32-bytes-long",
        ] {
            let error = args(Some(key))
                .receipt_links(true, "serve")
                .expect_err("refused");
            assert!(
                error.0.starts_with("LINK_SIGNING_KEY is a placeholder"),
                "{error}"
            );
            assert!(!error.0.contains(key), "{error}");
        }
    }

    #[test]
    fn empty_and_short_keys_are_refused_naming_the_variable_not_the_key() {
        for key in ["", "hunter2-short-key"] {
            for required in [true, false] {
                let error = args(Some(key))
                    .receipt_links(required, "serve")
                    .expect_err("refused");
                assert!(error.0.starts_with("LINK_SIGNING_KEY is "), "{error}");
                assert!(!error.0.contains("hunter2"), "{error}");
            }
        }
        let long = "k".repeat(32);
        assert!(args(Some(&long)).receipt_links(true, "serve").is_ok());
        assert!(!format!("{:?}", args(Some(&long))).contains("kkkk"));
    }

    #[test]
    fn previous_keys_are_checked_like_the_current_one() {
        let current = "c".repeat(32);
        let mut with = args(Some(&current));
        with.link_signing_keys_previous =
            Some(format!(" {}, {} ,", "a".repeat(32), "b".repeat(40)));
        let links = with
            .receipt_links(true, "serve")
            .expect("ok")
            .expect("links");
        assert!(format!("{links:?}").contains(&crate::links::key_id(&[b'a'; 32])));
        for (previous, says) in [
            ("short-key", "LINK_SIGNING_KEYS_PREVIOUS: key 1 is 9 bytes"),
            (
                "old-link-key-change-me-0123456789abcdef",
                "LINK_SIGNING_KEYS_PREVIOUS is a placeholder",
            ),
        ] {
            with.link_signing_keys_previous = Some(previous.to_owned());
            let error = with.receipt_links(true, "serve").expect_err("refused");
            assert!(error.0.starts_with(says), "{error}");
            assert!(!error.0.contains(previous), "{error}");
        }
    }
}
