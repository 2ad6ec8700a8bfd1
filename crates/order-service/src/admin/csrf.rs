//! CSRF tokens for the dashboard's forms.
//!
//! A form token is an HMAC of the session cookie's value, keyed by the
//! server's session key: it is tied to one session, needs no storage, and
//! cannot be made by a page that cannot read the cookie (HttpOnly) or the key. Every POST but
//! the login carries it in a hidden `csrf` field; the SameSite=Strict cookie
//! is a second line, not the only one.

use hmac::Mac as _;
use sha2::{Digest as _, Sha256};

use super::error::AdminError;
use super::session::SessionKey;

/// The form token of the session whose cookie is `cookie_value`.
pub(super) fn token_for(key: &SessionKey, cookie_value: &str) -> String {
    let mac = key.mac("csrf", &[cookie_value.as_bytes()]);
    hex::encode(mac.finalize().into_bytes())
}

/// Refuses a POST whose form token is missing or not `expected`, the
/// session's own (`Session::csrf`).
pub(super) fn check(expected: &str, given: Option<&str>) -> Result<(), AdminError> {
    match given {
        Some(given) if constant_time_eq(given.as_bytes(), expected.as_bytes()) => Ok(()),
        _ => Err(AdminError::CsrfRejected),
    }
}

/// Compares two secrets in time that depends on neither: both are hashed
/// first (so their lengths do not leak either), then every byte is compared.
pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq as _;
    let a = Sha256::digest(a);
    let b = Sha256::digest(b);
    a.ct_eq(&b).into()
}
