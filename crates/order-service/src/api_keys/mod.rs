//! API keys, stored and checked as GitHub and Stripe do theirs (the README,
//! "The order API"):
//!
//! - `secret`: the key itself, `ork_` + 43 random base62 characters + a
//!   6-character checksum, shown once; only its SHA-256 is stored;
//! - `scope`: what a key may do (`orders:place`, …, `orders:*`);
//! - `store`: creating, listing, revoking and authenticating keys in
//!   `api_keys`.
//!
//! The HTTP side (the `Authorization` header, 401/403/429) is `api::auth`;
//! the commands are `outbox-relay keys …` (`cli::keys`).

mod scope;
mod secret;
mod store;

pub use scope::{Scope, parse_scopes};
pub use secret::{KEY_PREFIX, MalformedKey, NewSecret, PresentedKey};
pub(crate) use store::{
    AUTHENTICATE_PARAMS, AUTHENTICATE_SQL, TOUCH_PARAMS, TOUCH_SQL, authenticate_on,
};
pub use store::{
    ApiKey, ApiKeyState, Authenticated, CreateKeyError, CreatedKey, KeyName, RevokeError, Revoked,
    authenticate, create_key, list_keys, revoke_key,
};
