//! `SECRETS_KEY` and `SECRETS_KEY_PREVIOUS`: the keys that seal the secrets
//! stored in `endpoints` and `sources`. Read by every command that writes or
//! uses those secrets; the sealing itself is `crate::sealed`'s.

use clap::Args;

use super::ConfigError;
use crate::sealed::{Keyring, SecretsKey};

/// The keys, as given. `Debug` hides them.
#[derive(Clone, Default, Args)]
pub struct SecretsKeyArgs {
    /// Seals the endpoints' and sources' secrets in the database: 32 random
    /// bytes as base64 or 64 hex digits (`openssl rand -base64 32`), the
    /// same on every process. Unset: they are stored in plaintext.
    #[arg(long, env = "SECRETS_KEY", hide_env_values = true)]
    pub secrets_key: Option<String>,
    /// The key before a rotation: values sealed with it still open, and
    /// `outbox-relay secrets seal` moves them to SECRETS_KEY.
    #[arg(long, env = "SECRETS_KEY_PREVIOUS", hide_env_values = true)]
    pub secrets_key_previous: Option<String>,
}

impl std::fmt::Debug for SecretsKeyArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretsKeyArgs")
            .field("secrets_key", &self.secrets_key.as_ref().map(|_| "***"))
            .field(
                "secrets_key_previous",
                &self.secrets_key_previous.as_ref().map(|_| "***"),
            )
            .finish()
    }
}

impl SecretsKeyArgs {
    /// The keyring, or why a key cannot be used (naming the variable, never
    /// the value). An empty variable counts as unset.
    pub fn keyring(&self) -> Result<Keyring, ConfigError> {
        let current = key("SECRETS_KEY", self.secrets_key.as_deref())?;
        let previous = key("SECRETS_KEY_PREVIOUS", self.secrets_key_previous.as_deref())?;
        Keyring::new(current, previous)
            .map_err(|e| ConfigError(format!("SECRETS_KEY_PREVIOUS {e}")))
    }
}

fn key(variable: &str, raw: Option<&str>) -> Result<Option<SecretsKey>, ConfigError> {
    let Some(raw) = raw.map(str::trim).filter(|raw| !raw.is_empty()) else {
        return Ok(None);
    };
    super::parse::refuse_placeholder(variable, raw)?;
    SecretsKey::parse(raw)
        .map(Some)
        .map_err(|e| ConfigError(format!("{variable} {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(current: Option<&str>, previous: Option<&str>) -> SecretsKeyArgs {
        SecretsKeyArgs {
            secrets_key: current.map(str::to_owned),
            secrets_key_previous: previous.map(str::to_owned),
        }
    }

    fn random_key() -> String {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).expect("randomness");
        hex::encode(bytes)
    }

    #[test]
    fn unset_or_empty_is_no_key_and_a_good_key_seals() {
        assert!(!args(None, None).keyring().expect("none").seals());
        assert!(!args(Some("  "), None).keyring().expect("empty").seals());
        let key = random_key();
        let previous = random_key();
        let keyring = args(Some(&key), Some(&previous))
            .keyring()
            .expect("two keys");
        assert!(keyring.seals() && keyring.previous_id().is_some());
        let shown = format!("{:?}", args(Some(&key), None));
        assert!(!shown.contains(&key), "{shown}");
    }

    #[test]
    fn bad_keys_name_their_variable_and_not_their_value() {
        let zeros = "0".repeat(64);
        for (given, variable) in [
            (args(Some("change-me-please"), None), "SECRETS_KEY"),
            (args(Some(&zeros), None), "SECRETS_KEY"),
            (args(Some("c2hvcnQ="), None), "SECRETS_KEY"),
            (
                args(Some(&random_key()), Some(&zeros)),
                "SECRETS_KEY_PREVIOUS",
            ),
            (args(None, Some(&random_key())), "SECRETS_KEY_PREVIOUS"),
        ] {
            let error = given.keyring().expect_err("refused").0;
            assert!(error.starts_with(variable), "{error}");
            assert!(
                !error.contains(&zeros) && !error.contains("c2hvcnQ="),
                "{error}"
            );
        }
        let key = random_key();
        let error = args(Some(&key), Some(&key)).keyring().expect_err("twice").0;
        assert!(error.contains("same key"), "{error}");
    }
}
