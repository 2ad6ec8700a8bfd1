//! `SECRETS_KEY`: 32 random bytes, given as 64 hex digits or as base64, and
//! the short id every value sealed with it carries.

use std::collections::HashSet;
use std::fmt;

use base64::Engine as _;
use chacha20poly1305::{KeyInit as _, XChaCha20Poly1305};
use sha2::{Digest as _, Sha256};
use zeroize::Zeroizing;

/// Bytes in a key.
pub const KEY_LEN: usize = 32;

/// Fewer distinct bytes than this among 32 is a pattern, not randomness: 32
/// random bytes have about 30 distinct values, and fewer than 16 happens
/// with a probability far below one in 2^100.
const MIN_DISTINCT_BYTES: usize = 16;

/// A key that seals secrets. Holds the key only inside its cipher, which
/// wipes it when dropped; `Debug` shows the id, never the key.
pub struct SecretsKey {
    cipher: XChaCha20Poly1305,
    id: String,
}

/// Why a value is not a usable key. Never carries the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("is neither 64 hex digits nor base64; make one with `openssl rand -base64 32`")]
    NotEncoded,
    #[error(
        "decodes to {0} bytes; it must be 32 random bytes \
         (`openssl rand -base64 32`)"
    )]
    WrongLength(usize),
    #[error("is not random ({0}); make one with `openssl rand -base64 32`")]
    NotRandom(&'static str),
    #[error("is the same key as SECRETS_KEY; give the key before the rotation, or leave it unset")]
    SameAsCurrent,
    #[error("is set, but SECRETS_KEY is not: the previous key only opens, a current one must seal")]
    PreviousWithoutCurrent,
}

impl SecretsKey {
    /// A key as an operator gives it: 64 hex digits, or base64 (standard or
    /// URL-safe, padded or not) of 32 bytes. Surrounding spaces and a final
    /// newline (a key file read whole) are ignored.
    pub fn parse(raw: &str) -> Result<SecretsKey, KeyError> {
        let raw = raw.trim();
        let decoded = Zeroizing::new(decode(raw).ok_or(KeyError::NotEncoded)?);
        let bytes: &[u8; KEY_LEN] = decoded
            .as_slice()
            .try_into()
            .map_err(|_| KeyError::WrongLength(decoded.len()))?;
        SecretsKey::from_bytes(bytes)
    }

    /// A key from its bytes, refused when they are visibly not random.
    pub fn from_bytes(bytes: &[u8; KEY_LEN]) -> Result<SecretsKey, KeyError> {
        refuse_patterns(bytes)?;
        Ok(SecretsKey {
            cipher: XChaCha20Poly1305::new(&(*bytes).into()),
            id: key_id(bytes),
        })
    }

    /// A new random key, from the operating system's generator.
    pub fn generate() -> Result<SecretsKey, getrandom::Error> {
        let mut bytes = Zeroizing::new([0u8; KEY_LEN]);
        getrandom::fill(bytes.as_mut_slice())?;
        // A draw that looks patterned has a probability below 2^-100; draw
        // again rather than fail.
        loop {
            match SecretsKey::from_bytes(&bytes) {
                Ok(key) => return Ok(key),
                Err(_) => getrandom::fill(bytes.as_mut_slice())?,
            }
        }
    }

    /// Eight hex digits naming this key in every value it sealed, so that a
    /// value says which key opens it without saying anything of the key.
    pub fn id(&self) -> &str {
        &self.id
    }

    pub(super) fn cipher(&self) -> &XChaCha20Poly1305 {
        &self.cipher
    }
}

impl fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretsKey(id {}, redacted)", self.id)
    }
}

fn decode(raw: &str) -> Option<Vec<u8>> {
    if raw.len() == 2 * KEY_LEN && raw.bytes().all(|b| b.is_ascii_hexdigit()) {
        return hex::decode(raw).ok();
    }
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
        .iter()
        .find_map(|engine| engine.decode(raw).ok())
}

/// The first four bytes of SHA-256 over a label and the key. The label keeps
/// the id from matching any other digest of the same key someone may publish.
fn key_id(bytes: &[u8; KEY_LEN]) -> String {
    let digest = Sha256::new()
        .chain_update(b"outbox-relay SECRETS_KEY id\0")
        .chain_update(bytes)
        .finalize();
    hex::encode(&digest[..4])
}

/// Keys copied from examples rather than drawn: one byte repeated (all
/// zeros), a short pattern repeated, a counting sequence (the RFC 8439 and
/// XChaCha test keys), or text typed in as bytes.
fn refuse_patterns(bytes: &[u8; KEY_LEN]) -> Result<(), KeyError> {
    if bytes.iter().all(|&b| b == bytes[0]) {
        return Err(KeyError::NotRandom("one byte repeated"));
    }
    if [2usize, 4, 8, 16].iter().any(|&period| {
        bytes
            .iter()
            .skip(period)
            .zip(bytes.iter())
            .all(|(a, b)| a == b)
    }) {
        return Err(KeyError::NotRandom("a short pattern repeated"));
    }
    let counting = |step: u8| bytes.windows(2).all(|w| w[1] == w[0].wrapping_add(step));
    if counting(1) || counting(u8::MAX) {
        return Err(KeyError::NotRandom(
            "a counting sequence, as in test vectors",
        ));
    }
    if bytes.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        return Err(KeyError::NotRandom(
            "printable text, not the decoding of random bytes",
        ));
    }
    if bytes.iter().collect::<HashSet<_>>().len() < MIN_DISTINCT_BYTES {
        return Err(KeyError::NotRandom("too few distinct bytes"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random_bytes() -> [u8; KEY_LEN] {
        let mut bytes = [0u8; KEY_LEN];
        getrandom::fill(&mut bytes).expect("randomness");
        bytes
    }

    #[test]
    fn a_key_reads_as_hex_or_any_base64_and_keeps_one_id() {
        let bytes = loop {
            let bytes = random_bytes();
            if refuse_patterns(&bytes).is_ok() {
                break bytes;
            }
        };
        use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
        let forms = [
            hex::encode(bytes),
            hex::encode_upper(bytes),
            STANDARD.encode(bytes),
            format!("  {}\n", STANDARD.encode(bytes)),
            URL_SAFE_NO_PAD.encode(bytes),
        ];
        let ids: HashSet<String> = forms
            .iter()
            .map(|form| SecretsKey::parse(form).expect("a key").id().to_owned())
            .collect();
        assert_eq!(ids.len(), 1, "{ids:?}");
        let id = ids.into_iter().next().expect("one id");
        assert_eq!(id.len(), 8);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        let other = SecretsKey::generate().expect("a key");
        assert_ne!(other.id(), id);
    }

    #[test]
    fn wrong_lengths_and_encodings_are_refused_without_the_value() {
        use base64::engine::general_purpose::STANDARD;
        let short = STANDARD.encode([7u8, 1, 9, 200, 3, 77, 12, 5, 99, 1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(
            SecretsKey::parse(&short).expect_err("16 bytes"),
            KeyError::WrongLength(16)
        );
        assert_eq!(
            SecretsKey::parse("not a key at all!").expect_err("not base64"),
            KeyError::NotEncoded
        );
        assert_eq!(
            SecretsKey::parse("").expect_err("empty"),
            KeyError::WrongLength(0)
        );
        let shown = KeyError::WrongLength(16).to_string();
        assert!(!shown.contains(&short), "{shown}");
    }

    #[test]
    fn placeholders_and_patterns_are_refused() {
        use base64::engine::general_purpose::STANDARD;
        let counting: Vec<u8> = (0x80..=0x9f).collect();
        let descending: Vec<u8> = (0..32u8).rev().collect();
        let text = b"my-very-secret-key-of-32-bytes!!";
        // Twelve values cycling: no period the pattern rule checks.
        let few: Vec<u8> = [3u8, 250, 17, 99, 140, 201, 5, 66, 180, 33, 7, 90]
            .iter()
            .cycle()
            .take(KEY_LEN)
            .copied()
            .collect();
        for (bytes, why) in [
            ([0u8; KEY_LEN].to_vec(), "one byte repeated"),
            ([0xffu8; KEY_LEN].to_vec(), "one byte repeated"),
            (
                [0xde, 0xad, 0xbe, 0xef].repeat(8),
                "a short pattern repeated",
            ),
            (counting, "a counting sequence, as in test vectors"),
            (descending, "a counting sequence, as in test vectors"),
            (
                text.to_vec(),
                "printable text, not the decoding of random bytes",
            ),
            (few, "too few distinct bytes"),
        ] {
            assert_eq!(
                SecretsKey::parse(&STANDARD.encode(&bytes)).expect_err("refused"),
                KeyError::NotRandom(why),
                "{bytes:02x?}"
            );
            assert_eq!(
                SecretsKey::parse(&hex::encode(&bytes)).expect_err("refused"),
                KeyError::NotRandom(why)
            );
        }
        // The all-zero key as people write it in examples.
        assert!(SecretsKey::parse(&"0".repeat(64)).is_err());
        assert!(SecretsKey::parse("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=").is_err());
    }

    #[test]
    fn debug_shows_the_id_and_never_the_key() {
        let bytes = random_bytes();
        let key = SecretsKey::from_bytes(&bytes).expect("random bytes make a key");
        let shown = format!("{key:?}");
        assert!(shown.contains(key.id()), "{shown}");
        assert!(!shown.contains(&hex::encode(bytes)), "{shown}");
        assert!(!shown.contains(&hex::encode(&bytes[..4])), "{shown}");
    }
}
