//! The key's text: `ork_`, 43 random base62 characters (256 bits, drawn
//! without modulo bias) and a 6-character base62 CRC-32 of what precedes it.
//!
//! The prefix lets secret scanners find a leaked key; the checksum lets them
//! (and the API, before any database query) tell a key from a typo or a
//! random string. Base62 keeps the key one word, so a double-click selects
//! all of it. Only the SHA-256 of the whole text is stored: the secret has
//! 256 bits of entropy, so a slow password hash would add nothing but cost.

use sha2::{Digest, Sha256};

/// The prefix of every key ("outbox-relay key").
pub const KEY_PREFIX: &str = "ork_";
const RANDOM_CHARS: usize = 43;
const CHECKSUM_CHARS: usize = 6;
/// The length of every key.
pub const KEY_LEN: usize = KEY_PREFIX.len() + RANDOM_CHARS + CHECKSUM_CHARS;

const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// A key just made: shown once, then dropped.
#[derive(Clone)]
pub struct NewSecret(String);

// Never printed by accident, in a log line or a panic message.
impl std::fmt::Debug for NewSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NewSecret(ork_…)")
    }
}

impl NewSecret {
    pub fn generate() -> anyhow::Result<NewSecret> {
        let mut key = String::with_capacity(KEY_LEN);
        key.push_str(KEY_PREFIX);
        let mut pool = [0u8; 64];
        while key.len() < KEY_PREFIX.len() + RANDOM_CHARS {
            getrandom::fill(&mut pool)
                .map_err(|e| anyhow::anyhow!("the system's random source failed: {e}"))?;
            // 248 = 4 × 62: bytes at or above it are dropped, so every
            // character is equally likely.
            for byte in pool.iter().copied().filter(|&b| b < 248) {
                if key.len() == KEY_PREFIX.len() + RANDOM_CHARS {
                    break;
                }
                key.push(char::from(BASE62[usize::from(byte % 62)]));
            }
        }
        key.push_str(&checksum(&key));
        Ok(NewSecret(key))
    }

    /// The key, to show once.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn sha256(&self) -> [u8; 32] {
        Sha256::digest(self.0.as_bytes()).into()
    }
}

/// A key as a client sent it, well-formed and with a valid checksum; only
/// its hash is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PresentedKey {
    sha256: [u8; 32],
}

/// Why a presented key is not a key at all. Each is a 401; the message says
/// which, without echoing the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MalformedKey {
    #[error("an API key is {KEY_LEN} characters long")]
    Length,
    #[error("an API key starts with {KEY_PREFIX}")]
    Prefix,
    #[error("an API key has only letters and digits after {KEY_PREFIX}")]
    Characters,
    #[error("the API key's checksum does not match: it was mistyped or cut short")]
    Checksum,
}

impl PresentedKey {
    pub fn parse(raw: &str) -> Result<PresentedKey, MalformedKey> {
        if raw.len() != KEY_LEN {
            return Err(MalformedKey::Length);
        }
        let Some(rest) = raw.strip_prefix(KEY_PREFIX) else {
            return Err(MalformedKey::Prefix);
        };
        if !rest.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(MalformedKey::Characters);
        }
        let (body, sum) = raw.split_at(KEY_LEN - CHECKSUM_CHARS);
        if checksum(body) != sum {
            return Err(MalformedKey::Checksum);
        }
        Ok(PresentedKey {
            sha256: Sha256::digest(raw.as_bytes()).into(),
        })
    }

    pub fn sha256(&self) -> [u8; 32] {
        self.sha256
    }
}

/// CRC-32 of `text` in 6 base62 digits (62⁶ > 2³²), most significant first.
fn checksum(text: &str) -> String {
    let mut value = u64::from(crc32fast::hash(text.as_bytes()));
    let mut digits = [b'0'; CHECKSUM_CHARS];
    for digit in digits.iter_mut().rev() {
        *digit = BASE62[(value % 62) as usize];
        value /= 62;
    }
    digits.iter().map(|&b| char::from(b)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_key_parses_and_hashes_to_the_same_digest() {
        let key = NewSecret::generate().expect("valid");
        assert_eq!(key.expose().len(), KEY_LEN);
        assert!(key.expose().starts_with("ork_"));
        let presented = PresentedKey::parse(key.expose()).expect("valid");
        assert_eq!(presented.sha256(), key.sha256());
    }

    #[test]
    fn two_keys_differ() {
        let (a, b) = (
            NewSecret::generate().expect("valid"),
            NewSecret::generate().expect("valid"),
        );
        assert_ne!(a.expose(), b.expose());
    }

    #[test]
    fn a_changed_character_fails_the_checksum() {
        let key = NewSecret::generate().expect("valid");
        let mut bytes = key.expose().as_bytes().to_vec();
        bytes[10] = if bytes[10] == b'a' { b'b' } else { b'a' };
        let typo = String::from_utf8(bytes).expect("valid");
        assert_eq!(PresentedKey::parse(&typo), Err(MalformedKey::Checksum));
    }

    #[test]
    fn strings_that_are_not_keys_are_told_apart() {
        assert_eq!(PresentedKey::parse("secret"), Err(MalformedKey::Length));
        let other = format!("ghp_{}", "a".repeat(KEY_LEN - 4));
        assert_eq!(PresentedKey::parse(&other), Err(MalformedKey::Prefix));
        let dashed = format!("ork_{}", "-".repeat(KEY_LEN - 4));
        assert_eq!(PresentedKey::parse(&dashed), Err(MalformedKey::Characters));
    }

    #[test]
    fn the_debug_form_hides_the_key() {
        let key = NewSecret::generate().expect("valid");
        assert!(!format!("{key:?}").contains(&key.expose()[4..]));
    }
}
