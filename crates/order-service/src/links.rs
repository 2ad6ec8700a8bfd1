//! Signed, expiring links for customers: the receipt link written into emails.
//!
//! A customer has no API key, so the link itself is the capability:
//! `/orders/{id}/receipt.pdf?expires=<unix seconds>&kid=<key id>&signature=<base64url>`,
//! where the signature is HMAC-SHA256 over the order id and the expiry, keyed
//! by `LINK_SIGNING_KEY`. Changing the id or stretching the expiry breaks the
//! signature; the key never leaves the server, and the comparison runs in
//! constant time.
//!
//! `kid` names the key that signed, so keys can rotate: the links of the
//! previous keys (`LINK_SIGNING_KEYS_PREVIOUS`) keep working while their
//! emails are still read. It is derived from the key (the first 8 hex digits
//! of its SHA-256), so no one assigns it. A link without one (signed before
//! key ids existed) is checked with the current key. An `expires` further
//! ahead than the TTL allows is refused, signature or not: a leaked key's
//! forgeries, or a signer misconfigured with a long TTL, cannot hand out
//! links that outlive a rotation.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac as _};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// How long a receipt link works (`RECEIPT_LINK_TTL`).
pub const DEFAULT_RECEIPT_LINK_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// The shortest `LINK_SIGNING_KEY` accepted: as many bytes as the MAC's output.
pub const MIN_LINK_KEY_BYTES: usize = 32;
/// How far past `now + ttl` an `expires` may be: the clocks of the relay
/// that signed and the `serve` that checks may differ this much.
pub const EXPIRES_SKEW: Duration = Duration::from_secs(300);
/// What a signature is made for, so one key could sign other links later
/// without a receipt signature ever passing for one of them.
const RECEIPT_PURPOSE: &[u8] = b"receipt.pdf";

/// Why a link is refused. `Malformed` and `Tampered` are both a 403 to the
/// client; they stay apart for the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    #[error("the link's expiry or signature is not in the expected form")]
    Malformed,
    #[error("the link's signature does not match it")]
    Tampered,
    #[error("the link has expired")]
    Expired,
    #[error("the link's key id names no key this server has")]
    UnknownKey,
    #[error("the link's expiry is further ahead than a link may last")]
    TooLong,
}

/// The query parameters of one signed link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedLink {
    /// Unix seconds after which the link no longer works.
    pub expires: u64,
    /// The id of the key that signed ([`key_id`]).
    pub kid: String,
    /// base64url, no padding.
    pub signature: String,
}

impl SignedLink {
    /// `expires=…&kid=…&signature=…`: every value is URL-safe as it is.
    pub fn query(&self) -> String {
        format!(
            "expires={}&kid={}&signature={}",
            self.expires, self.kid, self.signature
        )
    }
}

/// A key's id: the first 8 hex digits of its SHA-256. Public (it is in every
/// link) and says nothing of the key.
pub fn key_id(key: &[u8]) -> String {
    let digest = <Sha256 as sha2::Digest>::digest(key);
    hex::encode(&digest[..4])
}

/// One signing key, keyed once at start and cloned per use.
#[derive(Clone)]
struct LinkKey {
    id: String,
    mac: HmacSha256,
}

impl LinkKey {
    fn new(key: &[u8]) -> Result<LinkKey, String> {
        if key.len() < MIN_LINK_KEY_BYTES {
            return Err(format!(
                "is {} bytes; at least {MIN_LINK_KEY_BYTES} are needed \
                 (for example the output of `openssl rand -base64 32`)",
                key.len()
            ));
        }
        let mac = HmacSha256::new_from_slice(key).map_err(|e| format!("cannot key HMAC: {e}"))?;
        Ok(LinkKey {
            id: key_id(key),
            mac,
        })
    }

    fn mac_of(&self, order_id: i64, expires: u64) -> HmacSha256 {
        let mut mac = self.mac.clone();
        mac.update(RECEIPT_PURPOSE);
        mac.update(&[0]);
        mac.update(order_id.to_string().as_bytes());
        mac.update(&[0]);
        mac.update(expires.to_string().as_bytes());
        mac
    }
}

/// Signs and checks receipt links. `Debug` never shows a key.
#[derive(Clone)]
pub struct ReceiptLinks {
    /// Signs, and checks links with its id or with none.
    current: LinkKey,
    /// Only check, during a rotation.
    previous: Vec<LinkKey>,
    ttl: Duration,
}

impl std::fmt::Debug for ReceiptLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReceiptLinks")
            .field("key", &"***")
            .field("kid", &self.current.id)
            .field(
                "previous_kids",
                &self
                    .previous
                    .iter()
                    .map(|k| k.id.as_str())
                    .collect::<Vec<_>>(),
            )
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl ReceiptLinks {
    /// Links keyed by `key` that work for `ttl`. A key shorter than
    /// [`MIN_LINK_KEY_BYTES`] is refused: the message says why, not the key.
    pub fn new(key: &[u8], ttl: Duration) -> Result<ReceiptLinks, String> {
        Ok(ReceiptLinks {
            current: LinkKey::new(key)?,
            previous: Vec::new(),
            ttl,
        })
    }

    /// Also accepts the links signed by `keys` (older keys, during a
    /// rotation); never signs with them. The error says which one (1-based)
    /// is refused, not the key.
    pub fn with_previous<K: AsRef<[u8]>>(
        mut self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<ReceiptLinks, String> {
        for (i, key) in keys.into_iter().enumerate() {
            let key = LinkKey::new(key.as_ref()).map_err(|e| format!("key {} {e}", i + 1))?;
            if key.id == self.current.id || self.previous.iter().any(|k| k.id == key.id) {
                return Err(format!(
                    "key {} repeats the current key or an earlier one",
                    i + 1
                ));
            }
            self.previous.push(key);
        }
        Ok(self)
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The id of the key links are signed with.
    pub fn key_id(&self) -> &str {
        &self.current.id
    }

    /// A link to `order_id`'s receipt that works until `now + ttl` (`now` in
    /// unix seconds).
    pub fn sign(&self, order_id: i64, now: u64) -> SignedLink {
        let expires = now.saturating_add(self.ttl.as_secs());
        let tag = self
            .current
            .mac_of(order_id, expires)
            .finalize()
            .into_bytes();
        SignedLink {
            expires,
            kid: self.current.id.clone(),
            signature: URL_SAFE_NO_PAD.encode(tag),
        }
    }

    /// Checks a link's `expires`, `kid` and `signature` as they came in the
    /// query. The signature is checked before the expiry, so only a genuine
    /// link is ever told it has expired.
    pub fn verify(
        &self,
        order_id: i64,
        expires: &str,
        kid: Option<&str>,
        signature: &str,
        now: u64,
    ) -> Result<(), LinkError> {
        let expires: u64 = expires.parse().map_err(|_| LinkError::Malformed)?;
        let tag = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| LinkError::Malformed)?;
        let key = match kid {
            // Signed before links named their key: only the current key.
            None => &self.current,
            Some(kid) => std::iter::once(&self.current)
                .chain(&self.previous)
                .find(|k| k.id == kid)
                .ok_or(LinkError::UnknownKey)?,
        };
        key.mac_of(order_id, expires)
            .verify_slice(&tag)
            .map_err(|_| LinkError::Tampered)?;
        if expires <= now {
            return Err(LinkError::Expired);
        }
        let latest = now
            .saturating_add(self.ttl.as_secs())
            .saturating_add(EXPIRES_SKEW.as_secs());
        if expires > latest {
            return Err(LinkError::TooLong);
        }
        Ok(())
    }
}

/// Seconds since the Unix epoch, now (0 if the clock is before 1970).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
    const NOW: u64 = 1_800_000_000;

    fn links() -> ReceiptLinks {
        ReceiptLinks::new(KEY, Duration::from_secs(3600)).expect("a long enough key")
    }

    #[test]
    fn a_signed_link_verifies_until_it_expires() {
        let links = links();
        let link = links.sign(42, NOW);
        assert_eq!(link.expires, NOW + 3600);
        let expires = link.expires.to_string();
        assert_eq!(
            links.verify(42, &expires, Some(&link.kid), &link.signature, NOW),
            Ok(())
        );
        assert_eq!(
            links.verify(42, &expires, Some(&link.kid), &link.signature, NOW + 3599),
            Ok(())
        );
        assert_eq!(
            links.verify(42, &expires, Some(&link.kid), &link.signature, NOW + 3600),
            Err(LinkError::Expired)
        );
        assert_eq!(
            link.query(),
            format!(
                "expires={}&kid={}&signature={}",
                link.expires, link.kid, link.signature
            )
        );
    }

    #[test]
    fn another_order_a_longer_expiry_or_another_key_is_tampered() {
        let links = links();
        let link = links.sign(42, NOW);
        let expires = link.expires.to_string();
        assert_eq!(
            links.verify(43, &expires, Some(&link.kid), &link.signature, NOW),
            Err(LinkError::Tampered)
        );
        let later = (link.expires + 86_400).to_string();
        assert_eq!(
            links.verify(42, &later, Some(&link.kid), &link.signature, NOW),
            Err(LinkError::Tampered)
        );
        let other = ReceiptLinks::new(b"another key of thirty-two bytes!", Duration::from_secs(60))
            .expect("key");
        assert_eq!(
            other.verify(42, &expires, None, &link.signature, NOW),
            Err(LinkError::Tampered)
        );
        // A genuine signature cut short is still well-formed base64url.
        assert_eq!(
            links.verify(42, &expires, Some(&link.kid), &link.signature[..20], NOW),
            Err(LinkError::Tampered)
        );
    }

    #[test]
    fn an_expired_link_with_a_wrong_signature_is_tampered_not_expired() {
        let links = links();
        let link = links.sign(42, NOW);
        let expires = link.expires.to_string();
        assert_eq!(
            links.verify(7, &expires, Some(&link.kid), &link.signature, NOW + 10_000),
            Err(LinkError::Tampered)
        );
    }

    #[test]
    fn signatures_in_another_encoding_and_odd_expiries_are_malformed() {
        let links = links();
        let link = links.sign(42, NOW);
        let expires = link.expires.to_string();
        let tag = URL_SAFE_NO_PAD.decode(&link.signature).expect("base64url");
        for signature in [
            hex::encode(&tag),
            base64::engine::general_purpose::STANDARD.encode(&tag),
            "not base64!".to_owned(),
        ] {
            // Hex happens to be valid base64url; it decodes to other bytes.
            let verdict = links.verify(42, &expires, Some(&link.kid), &signature, NOW);
            assert!(
                matches!(verdict, Err(LinkError::Malformed | LinkError::Tampered)),
                "{signature}: {verdict:?}"
            );
        }
        for expires in ["", "-1", "soon", "1e9", "99999999999999999999999"] {
            assert_eq!(
                links.verify(42, expires, Some(&link.kid), &link.signature, NOW),
                Err(LinkError::Malformed),
                "{expires:?}"
            );
        }
    }

    #[test]
    fn short_keys_are_refused_and_debug_hides_the_key() {
        assert!(ReceiptLinks::new(b"", Duration::from_secs(1)).is_err());
        let short = ReceiptLinks::new(&KEY[..31], Duration::from_secs(1)).expect_err("short");
        assert!(short.contains("31 bytes"), "{short}");
        assert!(!format!("{:?}", links()).contains("0123456789"));
    }

    #[test]
    fn previous_keys_verify_their_links_and_links_without_a_key_id_only_the_current_key() {
        const OLD: &[u8] = b"an older key of thirty-two bytes";
        let old = ReceiptLinks::new(OLD, Duration::from_secs(3600)).expect("key");
        let link = old.sign(42, NOW);
        let expires = link.expires.to_string();
        assert_eq!(link.kid, key_id(OLD));
        assert_eq!(link.kid.len(), 8);
        let rotated = links().with_previous([OLD]).expect("previous");
        assert_eq!(
            rotated.verify(42, &expires, Some(&link.kid), &link.signature, NOW),
            Ok(())
        );
        assert_eq!(
            links().verify(42, &expires, Some(&link.kid), &link.signature, NOW),
            Err(LinkError::UnknownKey)
        );
        // Without a kid, only the current key is tried.
        assert_eq!(
            rotated.verify(42, &expires, None, &link.signature, NOW),
            Err(LinkError::Tampered)
        );
        let current = links().sign(42, NOW);
        assert_eq!(
            rotated.verify(42, &expires, None, &current.signature, NOW),
            Ok(())
        );
        assert!(links().with_previous([KEY]).is_err());
        assert!(links().with_previous([&OLD[..31]]).is_err());
    }

    #[test]
    fn an_expiry_beyond_the_ttl_is_refused_even_when_signed() {
        let long = ReceiptLinks::new(KEY, Duration::from_secs(10 * 3600)).expect("key");
        let link = long.sign(42, NOW);
        let expires = link.expires.to_string();
        assert_eq!(
            links().verify(42, &expires, Some(&link.kid), &link.signature, NOW),
            Err(LinkError::TooLong)
        );
        let skewed = ReceiptLinks::new(KEY, Duration::from_secs(3600 + 60)).expect("key");
        let link = skewed.sign(42, NOW);
        assert_eq!(
            links().verify(
                42,
                &link.expires.to_string(),
                Some(&link.kid),
                &link.signature,
                NOW
            ),
            Ok(())
        );
    }
}
