//! A `stripe` source's API key, which reads its event log: what a valid
//! one looks like, and giving a source one (`sources set-api-key`). Sealed
//! like its signing secrets (`sources.api_key`).

use diesel::prelude::*;

use crate::inbox::source::{Source, SourceError, SourceKind, SourceMode};
use crate::schema::sources;
use crate::sealed::{Keyring, SOURCE_API_KEY};

/// A Stripe API key given with `flag`: a secret key (`sk_live_…`,
/// `sk_test_…`) or a restricted one (`rk_…`, read access to events is
/// enough). A publishable key (`pk_…`) cannot read events; a key of the other
/// mode than the source's would read the other mode's log. Never echoed.
pub fn check_api_key(
    raw: &str,
    mode: SourceMode,
    flag: &'static str,
) -> Result<String, SourceError> {
    let raw = raw.trim();
    let refused = |message: String| SourceError::BadSecret { flag, message };
    let live = ["sk_live_", "rk_live_"].iter().any(|p| raw.starts_with(p));
    let test = ["sk_test_", "rk_test_"].iter().any(|p| raw.starts_with(p));
    if !(live || test) {
        return Err(refused(
            "a Stripe API key starts with sk_live_, sk_test_, rk_live_ or rk_test_ (a \
             restricted key with read access to events is enough; a publishable pk_ key cannot \
             read events)"
                .into(),
        ));
    }
    if raw.len() < 20 || raw.len() > 512 || raw.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(refused(
            "a Stripe API key is 20 to 512 characters without spaces".into(),
        ));
    }
    if !mode.takes(live) {
        return Err(refused(format!(
            "a {} key for a source that takes {mode} events only: it would read the other \
             mode's event log",
            if live { "live-mode" } else { "test-mode" }
        )));
    }
    Ok(raw.to_owned())
}

/// Gives `stripe` source `name` the API key that reads its event log
/// (checked by [`check_api_key`] first), sealed when `keys` has a key; it
/// replaces the one it had.
pub fn set_api_key(
    conn: &mut PgConnection,
    name: &str,
    api_key: &str,
    keys: &Keyring,
) -> Result<Source, SourceError> {
    conn.transaction(|conn| {
        let current: Source = sources::table
            .filter(sources::name.eq(name))
            .select(Source::as_select())
            .for_update()
            .first(conn)
            .optional()?
            .ok_or_else(|| SourceError::NotFound(name.to_owned()))?;
        if current.kind() != SourceKind::Stripe {
            return Err(SourceError::ApiKeyOfStandard(name.to_owned()));
        }
        let stored = keys.seal(SOURCE_API_KEY.at(current.id), api_key)?;
        Ok(diesel::update(sources::table.find(current.id))
            .set(sources::api_key.eq(stored))
            .returning(Source::as_returning())
            .get_result(conn)?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_keys_are_stripe_secret_or_restricted_keys_of_the_sources_mode() {
        let test_key = "rk_test_51Hx0aBcDeFgHiJkLmNoPq";
        assert!(check_api_key(test_key, SourceMode::Any, "--api-key-file").is_ok());
        assert!(check_api_key(test_key, SourceMode::Test, "--api-key-file").is_ok());
        let other_mode =
            check_api_key(test_key, SourceMode::Live, "--api-key-file").expect_err("test key");
        assert!(
            other_mode.to_string().contains("test-mode key"),
            "{other_mode}"
        );
        assert!(!other_mode.to_string().contains(test_key), "{other_mode}");
        let publishable = check_api_key(
            "pk_test_51Hx0aBcDeFgHiJkLmNoPq",
            SourceMode::Any,
            "--api-key-file",
        )
        .expect_err("a publishable key");
        assert!(
            publishable.to_string().starts_with("--api-key-file: "),
            "{publishable}"
        );
        assert!(check_api_key("sk_test_short", SourceMode::Any, "--api-key-file").is_err());
    }
}
