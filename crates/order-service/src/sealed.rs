//! Secrets sealed at rest: what `endpoints` and `sources` store of their
//! signing secrets, NATS credentials and provider API keys when
//! `SECRETS_KEY` is set.
//!
//! A sealed value is `enc:v1:<key id>:<base64 of nonce || ciphertext || tag>`:
//! XChaCha20-Poly1305 under the key, with a random 24-byte nonce (at that
//! size random nonces never repeat in practice, so no counter is kept
//! anywhere). Its associated data names its place, table, column and row
//! id, so a value copied to another row or column does not open. A value
//! without the prefix is plaintext, as every value was before a key was
//! set: it reads as it is, and `outbox-relay secrets seal` seals it.
//!
//! A leaf: the places are names here, the tables are read and written by
//! their own modules, which call [`Keyring::seal`] and [`Keyring::open`].

mod key;

use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use chacha20poly1305::XNonce;
use chacha20poly1305::aead::{Aead as _, Payload};

pub use key::{KEY_LEN, KeyError, SecretsKey};

/// What every sealed value starts with.
pub const PREFIX: &str = "enc:v1:";

/// What a new row holds until its sealed secret, which names the row's id,
/// is written in the same transaction: a value that never opens, so that no
/// reader could ever take it for a key (an empty secret would be one).
pub const NOT_YET_SEALED: &str = PREFIX;
const NONCE_LEN: usize = 24;
const TAG_LEN: usize = 16;

/// A column that holds a secret, and what people call its content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    pub table: &'static str,
    pub name: &'static str,
    pub what: &'static str,
}

impl Column {
    /// This column in the row `id`.
    pub const fn at(self, id: i64) -> Place {
        Place { column: self, id }
    }
}

pub const ENDPOINT_SECRET: Column = Column {
    table: "endpoints",
    name: "secret",
    what: "signing secret",
};
pub const ENDPOINT_PREVIOUS_SECRET: Column = Column {
    table: "endpoints",
    name: "previous_secret",
    what: "previous signing secret",
};
pub const ENDPOINT_NATS_CREDENTIALS: Column = Column {
    table: "endpoints",
    name: "nats_credentials",
    what: "NATS credentials",
};
pub const SOURCE_SECRET: Column = Column {
    table: "sources",
    name: "secret",
    what: "signing secret",
};
pub const SOURCE_PREVIOUS_SECRET: Column = Column {
    table: "sources",
    name: "previous_secret",
    what: "previous signing secret",
};

pub const SOURCE_API_KEY: Column = Column {
    table: "sources",
    name: "api_key",
    what: "provider API key",
};

/// Every column that is sealed when a key is set.
pub const COLUMNS: [Column; 6] = [
    ENDPOINT_SECRET,
    ENDPOINT_PREVIOUS_SECRET,
    ENDPOINT_NATS_CREDENTIALS,
    SOURCE_SECRET,
    SOURCE_PREVIOUS_SECRET,
    SOURCE_API_KEY,
];

/// One value's place: its column in the row with this id (the primary key,
/// which no other row ever has, not even after this one is removed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub column: Column,
    pub id: i64,
}

impl Place {
    fn associated_data(&self) -> Vec<u8> {
        format!(
            "outbox-relay sealed v1\0{}\0{}\0{}",
            self.column.table, self.column.name, self.id
        )
        .into_bytes()
    }
}

/// The keys of this process: the current one seals and opens, the previous
/// one (during a rotation) only opens. Without a current key, values are
/// written in plaintext, as before keys existed.
#[derive(Clone, Default)]
pub struct Keyring {
    current: Option<Arc<SecretsKey>>,
    previous: Option<Arc<SecretsKey>>,
    /// `SECRETS_PLAINTEXT=refuse`: no value is ever written in plaintext,
    /// and the services refuse to start while one is stored.
    refuse_plaintext: bool,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("current", &self.current_id())
            .field("previous", &self.previous_id())
            .field("refuse_plaintext", &self.refuse_plaintext)
            .finish()
    }
}

/// What a stored value is, for this keyring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored<'a> {
    Plaintext,
    /// Sealed under the current key.
    Current,
    /// Sealed under the previous key: it opens, and `secrets seal` moves it.
    Previous,
    /// Sealed under a key this process does not have.
    Unknown(&'a str),
}

impl Keyring {
    /// No key: plaintext in, plaintext out; a sealed value is an error.
    pub fn none() -> Keyring {
        Keyring::default()
    }

    /// Seals with `key`, and opens what it sealed.
    pub fn with_key(key: SecretsKey) -> Keyring {
        Keyring {
            current: Some(Arc::new(key)),
            previous: None,
            refuse_plaintext: false,
        }
    }

    /// `SECRETS_KEY` and `SECRETS_KEY_PREVIOUS`. A previous key alone, or
    /// the same key twice, is a mistake in the deployment: refused.
    pub fn new(
        current: Option<SecretsKey>,
        previous: Option<SecretsKey>,
    ) -> Result<Keyring, KeyError> {
        match (&current, &previous) {
            (None, Some(_)) => return Err(KeyError::PreviousWithoutCurrent),
            (Some(current), Some(previous)) if current.id() == previous.id() => {
                return Err(KeyError::SameAsCurrent);
            }
            _ => {}
        }
        Ok(Keyring {
            current: current.map(Arc::new),
            previous: previous.map(Arc::new),
            refuse_plaintext: false,
        })
    }

    /// The same keys, refusing to write any value in plaintext
    /// (`SECRETS_PLAINTEXT=refuse`): without a current key, [`Keyring::seal`]
    /// is an error.
    pub fn refusing_plaintext(self) -> Keyring {
        Keyring {
            refuse_plaintext: true,
            ..self
        }
    }

    /// Whether plaintext values are refused, stored or new.
    pub fn refuses_plaintext(&self) -> bool {
        self.refuse_plaintext
    }

    /// Whether new values are sealed.
    pub fn seals(&self) -> bool {
        self.current.is_some()
    }

    pub fn current_id(&self) -> Option<&str> {
        self.current.as_deref().map(SecretsKey::id)
    }

    pub fn previous_id(&self) -> Option<&str> {
        self.previous.as_deref().map(SecretsKey::id)
    }

    /// `plaintext` as it is to be stored at `place`: sealed under the
    /// current key, or as it is without one (unless plaintext is refused).
    pub fn seal(&self, place: Place, plaintext: &str) -> Result<String, SealError> {
        let Some(key) = &self.current else {
            if self.refuse_plaintext {
                return Err(SealError::PlaintextRefused);
            }
            // Stored as it is, it would read back as a broken sealed value.
            if plaintext.starts_with(PREFIX) {
                return Err(SealError::LooksSealed);
            }
            return Ok(plaintext.to_owned());
        };
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|e| SealError::NoRandomness(e.to_string()))?;
        let aad = place.associated_data();
        let sealed = key
            .cipher()
            .encrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: plaintext.as_bytes(),
                    aad: &aad,
                },
            )
            .map_err(|_| SealError::TooLong)?;
        let mut bytes = Vec::with_capacity(NONCE_LEN + sealed.len());
        bytes.extend_from_slice(&nonce);
        bytes.extend_from_slice(&sealed);
        Ok(format!("{PREFIX}{}:{}", key.id(), STANDARD.encode(bytes)))
    }

    /// The plaintext of `stored`, read from `place`: opened with the key its
    /// id names, or as it is when it was stored in plaintext.
    pub fn open(&self, place: Place, stored: &str) -> Result<String, OpenError> {
        let Some((key_id, body)) = split(stored)? else {
            return Ok(stored.to_owned());
        };
        let key = self.key(key_id)?;
        let bytes = STANDARD.decode(body).map_err(|_| OpenError::Malformed)?;
        if bytes.len() < NONCE_LEN + TAG_LEN {
            return Err(OpenError::Malformed);
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let nonce: [u8; NONCE_LEN] = nonce.try_into().map_err(|_| OpenError::Malformed)?;
        let aad = place.associated_data();
        let opened = key
            .cipher()
            .decrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: sealed,
                    aad: &aad,
                },
            )
            .map_err(|_| OpenError::DoesNotOpen {
                key_id: key_id.to_owned(),
            })?;
        // Authenticated, so it is what `seal` was given: UTF-8.
        String::from_utf8(opened).map_err(|_| OpenError::Malformed)
    }

    /// Whether `stored` is plaintext, or under which key it is sealed.
    pub fn state_of<'a>(&self, stored: &'a str) -> Stored<'a> {
        match key_id_of(stored) {
            None => Stored::Plaintext,
            Some(id) if Some(id) == self.current_id() => Stored::Current,
            Some(id) if Some(id) == self.previous_id() => Stored::Previous,
            Some(id) => Stored::Unknown(id),
        }
    }

    fn key(&self, key_id: &str) -> Result<&SecretsKey, OpenError> {
        [&self.current, &self.previous]
            .into_iter()
            .flatten()
            .map(Arc::as_ref)
            .find(|key| key.id() == key_id)
            .ok_or_else(|| match self.current_id() {
                None => OpenError::NoKey {
                    key_id: key_id.to_owned(),
                },
                Some(current) => OpenError::UnknownKey {
                    key_id: key_id.to_owned(),
                    current: current.to_owned(),
                    previous: self.previous_id().map(str::to_owned),
                },
            })
    }
}

/// The id of the key `stored` is sealed under; `None` for plaintext (or a
/// value that only starts like a sealed one).
pub fn key_id_of(stored: &str) -> Option<&str> {
    split(stored).ok().flatten().map(|(id, _)| id)
}

/// A sealed value's key id and body; `None` for plaintext.
fn split(stored: &str) -> Result<Option<(&str, &str)>, OpenError> {
    let Some(rest) = stored.strip_prefix(PREFIX) else {
        return Ok(None);
    };
    let (key_id, body) = rest.split_once(':').ok_or(OpenError::Malformed)?;
    if key_id.len() != 8 || !key_id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(OpenError::Malformed);
    }
    Ok(Some((key_id, body)))
}

/// Why a value cannot be sealed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("no randomness for a nonce: {0}")]
    NoRandomness(String),
    #[error("the secret is too long to seal")]
    TooLong,
    #[error(
        "the secret starts with \"enc:v1:\", which marks sealed values: set SECRETS_KEY to \
         store it sealed, or choose another"
    )]
    LooksSealed,
    #[error(
        "SECRETS_PLAINTEXT=refuse and SECRETS_KEY is not set: the secret would be stored in \
         plaintext"
    )]
    PlaintextRefused,
}

/// Why a stored value cannot be read. Never carries the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("it is sealed under key {key_id}, and SECRETS_KEY is not set")]
    NoKey { key_id: String },
    #[error(
        "it is sealed under key {key_id}, which is neither SECRETS_KEY (key {current}) nor \
         SECRETS_KEY_PREVIOUS{}: SECRETS_KEY is wrong, or the key it was sealed with is \
         missing", .previous.as_deref().map(|p| format!(" (key {p})")).unwrap_or_default()
    )]
    UnknownKey {
        key_id: String,
        current: String,
        previous: Option<String>,
    },
    #[error(
        "it does not open with key {key_id}: it was altered, or copied from another row or column"
    )]
    DoesNotOpen { key_id: String },
    #[error("it starts with \"enc:v1:\" but is not a sealed value (cut short or altered)")]
    Malformed,
}

impl OpenError {
    /// Whether configuring the right key would fix it (as opposed to a value
    /// that no key opens).
    pub fn is_missing_key(&self) -> bool {
        matches!(self, OpenError::NoKey { .. } | OpenError::UnknownKey { .. })
    }

    /// This error about the value of `column` that belongs to `owner`
    /// (`endpoint "erp"`).
    pub fn about(self, owner: impl fmt::Display, column: Column) -> Unreadable {
        Unreadable {
            owner: owner.to_string(),
            what: column.what,
            error: self,
        }
    }
}

/// A stored secret that cannot be read, and whose it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {what} of {owner} cannot be read: {error}")]
pub struct Unreadable {
    pub owner: String,
    pub what: &'static str,
    pub error: OpenError,
}

impl Unreadable {
    pub fn is_missing_key(&self) -> bool {
        self.error.is_missing_key()
    }
}

#[cfg(test)]
mod tests;
