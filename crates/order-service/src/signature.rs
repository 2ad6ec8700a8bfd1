//! Webhook signatures: Standard Webhooks v1 (`webhook-signature`) and the
//! older `X-Signature`, both from `WEBHOOK_SECRET`. A leaf: the deliveries
//! (`effects/webhook/`) sign with it and the inbox (`inbox/verify.rs`) checks
//! with it, so it imports neither.
//!
//! `WEBHOOK_SECRET` may list several secrets, separated by spaces, so a
//! receiver can move to a new key without a window where deliveries fail: the
//! sender signs with every listed secret and the receiver accepts any
//! signature it can check. A secret written `whsec_<base64>` is keyed with the
//! decoded bytes, as the Standard Webhooks libraries do; any other secret with
//! its bytes as written.
//!
//! `X-Signature` predates rotation: it stays one signature, keyed with the
//! first secret's bytes exactly as written (prefix and all), which is what
//! existing receivers were given.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The prefix of a signing secret given as base64 key bytes (Standard
/// Webhooks' `whsec_`): the form an endpoint's secret is written and read in.
pub const WHSEC_PREFIX: &str = "whsec_";

/// How far a `webhook-timestamp` may be from the receiver's clock, either way,
/// before [`Secrets::verify`] refuses it as a possible replay (the spec's 5 minutes).
pub const TOLERANCE_SECS: i64 = 5 * 60;

/// Secrets are decoded with or without `=` padding: both forms circulate.
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Why `WEBHOOK_SECRET` cannot be used. Never carries the secret itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("is empty")]
    Empty,
    #[error(
        "secret {position} of {count} starts with whsec_ but the rest is not base64 ({reason})"
    )]
    NotBase64 {
        position: usize,
        count: usize,
        reason: String,
    },
    #[error("secret {position} of {count} is whsec_ with no key after it")]
    EmptyKey { position: usize, count: usize },
}

/// The parsed `WEBHOOK_SECRET`: one HMAC key per listed secret, in order.
#[derive(Clone)]
pub struct Secrets {
    /// Keyed once; cloned per signature.
    v1: Vec<Hmac<Sha256>>,
    /// The first secret's bytes as written, for `X-Signature`.
    x_signature: Hmac<Sha256>,
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secrets")
            .field("count", &self.v1.len())
            .finish_non_exhaustive()
    }
}

impl Secrets {
    /// Parses space-separated secrets. A `whsec_` secret whose base64 does not
    /// decode is an error: signing with the wrong key would fail every delivery.
    pub fn parse(raw: &str) -> Result<Secrets, SecretError> {
        let written: Vec<&str> = raw.split_whitespace().collect();
        let count = written.len();
        let first = written.first().ok_or(SecretError::Empty)?;
        let v1 = written
            .iter()
            .enumerate()
            .map(|(i, secret)| {
                let key = match secret.strip_prefix(WHSEC_PREFIX) {
                    Some(encoded) => {
                        let key = LENIENT
                            .decode(encoded)
                            .map_err(|e| SecretError::NotBase64 {
                                position: i + 1,
                                count,
                                // base64's messages name an offset and a byte; the
                                // byte is part of the secret, so only the kind is kept.
                                reason: base64_reason(&e).to_owned(),
                            })?;
                        if key.is_empty() {
                            return Err(SecretError::EmptyKey {
                                position: i + 1,
                                count,
                            });
                        }
                        key
                    }
                    None => secret.as_bytes().to_vec(),
                };
                Ok(hmac_key(&key))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Secrets {
            v1,
            x_signature: hmac_key(first.as_bytes()),
        })
    }

    /// How many secrets sign each delivery.
    pub fn len(&self) -> usize {
        self.v1.len()
    }

    pub fn is_empty(&self) -> bool {
        self.v1.is_empty()
    }

    /// The `webhook-signature` value: `v1,<base64>` per secret, space-separated.
    pub fn sign_v1(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        self.v1
            .iter()
            .map(|mac| format!("v1,{}", STANDARD.encode(tag(mac, id, timestamp, body))))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The `X-Signature` value: `sha256=<hex HMAC-SHA256 of the body>`.
    pub fn x_signature(&self, body: &[u8]) -> String {
        let mut mac = self.x_signature.clone();
        mac.update(body);
        format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
    }

    /// A receiver's check of the Standard Webhooks headers: the timestamp is
    /// within [`TOLERANCE_SECS`] of `now` (Unix seconds) and some `v1,`
    /// signature in `signature` is the HMAC with one of these secrets. A
    /// header of more than [`MAX_SIGNATURE_ENTRIES`] entries is refused
    /// unread, and the body's MAC is computed once per secret, so no header
    /// makes a check cost more than a valid one. The comparison is
    /// constant-time, so timing does not leak how much matched.
    pub fn verify(
        &self,
        id: &str,
        timestamp: &str,
        body: &[u8],
        signature: &str,
        now: i64,
    ) -> bool {
        let Ok(timestamp) = timestamp.trim().parse::<i64>() else {
            return false;
        };
        if now.abs_diff(timestamp) > TOLERANCE_SECS.unsigned_abs() {
            return false;
        }
        match v1_candidates(signature) {
            Ok(candidates) => self.matches_v1(id, timestamp, body, &candidates),
            Err(TooManyEntries(_)) => false,
        }
    }

    /// Whether some candidate is the `v1` tag of `{id}.{timestamp}.{body}`
    /// with one of these secrets: one MAC of the body per secret, then a
    /// constant-time comparison per candidate (a clone of the fed MAC only
    /// finalizes: two blocks, whatever the body's length).
    pub fn matches_v1(
        &self,
        id: &str,
        timestamp: i64,
        body: &[u8],
        candidates: &[Vec<u8>],
    ) -> bool {
        if candidates.is_empty() {
            return false;
        }
        self.v1.iter().any(|key| {
            let mut mac = key.clone();
            feed(&mut mac, id, timestamp, body);
            candidates
                .iter()
                .any(|candidate| mac.clone().verify_slice(candidate).is_ok())
        })
    }

    /// A receiver's check of `X-Signature` (`sha256=<hex>`), constant-time.
    pub fn verify_x_signature(&self, body: &[u8], header: &str) -> bool {
        header
            .strip_prefix("sha256=")
            .and_then(|h| hex::decode(h).ok())
            .is_some_and(|sig| {
                self.x_signature
                    .clone()
                    .chain_update(body)
                    .verify_slice(&sig)
                    .is_ok()
            })
    }
}

/// The most signature entries a receiver reads from one header: a sender
/// signs once per active secret, and no provider keeps more than a few during
/// a rotation.
pub const MAX_SIGNATURE_ENTRIES: usize = 10;

/// A signature header with more entries than [`MAX_SIGNATURE_ENTRIES`]: how
/// many it had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyEntries(pub usize);

/// The decoded `v1,<base64>` entries of a `webhook-signature` header (other
/// versions and undecodable ones are skipped, as the spec says), refused when
/// the header holds more than [`MAX_SIGNATURE_ENTRIES`] entries of any kind:
/// counting needs no decoding, so a refused header costs one pass over it.
pub fn v1_candidates(signature: &str) -> Result<Vec<Vec<u8>>, TooManyEntries> {
    let entries = signature.split_whitespace().count();
    if entries > MAX_SIGNATURE_ENTRIES {
        return Err(TooManyEntries(entries));
    }
    Ok(signature
        .split_whitespace()
        .filter_map(|entry| entry.strip_prefix("v1,"))
        .filter_map(|b64| STANDARD.decode(b64).ok())
        .collect())
}

fn hmac_key(key: &[u8]) -> Hmac<Sha256> {
    // HMAC takes keys of any length (long ones are hashed first); the error
    // type exists for MACs with fixed key sizes.
    match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC-SHA256 accepts keys of every length"),
    }
}

/// The signed content is `{id}.{timestamp}.{body}`, fed in pieces so the body
/// is not copied.
fn feed(mac: &mut Hmac<Sha256>, id: &str, timestamp: i64, body: &[u8]) {
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
}

fn tag(key: &Hmac<Sha256>, id: &str, timestamp: i64, body: &[u8]) -> Vec<u8> {
    let mut mac = key.clone();
    feed(&mut mac, id, timestamp, body);
    mac.finalize().into_bytes().to_vec()
}

fn base64_reason(error: &base64::DecodeError) -> &'static str {
    match error {
        base64::DecodeError::InvalidByte(..) => "a character outside the base64 alphabet",
        base64::DecodeError::InvalidLength(_) => "a length no base64 text has",
        base64::DecodeError::InvalidLastSymbol(..) => "a last character with stray bits",
        base64::DecodeError::InvalidPadding => "misplaced = padding",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VECTOR_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const VECTOR_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const VECTOR_TS: i64 = 1_614_265_330;
    const VECTOR_BODY: &[u8] = br#"{"test": 2432232314}"#;
    const VECTOR_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn secrets(raw: &str) -> Secrets {
        Secrets::parse(raw).expect("valid secrets")
    }

    #[test]
    fn the_published_standard_webhooks_vector_signs_and_verifies() {
        let s = secrets(VECTOR_SECRET);
        assert_eq!(
            s.sign_v1(VECTOR_ID, VECTOR_TS, VECTOR_BODY),
            VECTOR_SIGNATURE
        );
        assert!(s.verify(
            VECTOR_ID,
            "1614265330",
            VECTOR_BODY,
            VECTOR_SIGNATURE,
            VECTOR_TS
        ));
    }

    #[test]
    fn verification_refuses_other_bodies_ids_stale_timestamps_and_garbage() {
        let s = secrets(VECTOR_SECRET);
        let ts = "1614265330";
        assert!(!s.verify(VECTOR_ID, ts, b"{\"test\": 1}", VECTOR_SIGNATURE, VECTOR_TS));
        assert!(!s.verify("msg_other", ts, VECTOR_BODY, VECTOR_SIGNATURE, VECTOR_TS));
        assert!(!s.verify(
            VECTOR_ID,
            ts,
            VECTOR_BODY,
            VECTOR_SIGNATURE,
            VECTOR_TS + 301
        ));
        assert!(s.verify(
            VECTOR_ID,
            ts,
            VECTOR_BODY,
            VECTOR_SIGNATURE,
            VECTOR_TS - 300
        ));
        assert!(!s.verify(VECTOR_ID, "soon", VECTOR_BODY, VECTOR_SIGNATURE, VECTOR_TS));
        for garbage in [
            "",
            "v1,",
            "v1,!!!",
            "v2,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        ] {
            assert!(
                !s.verify(VECTOR_ID, ts, VECTOR_BODY, garbage, VECTOR_TS),
                "{garbage:?}"
            );
        }
        let other = secrets("whsec_c2VjcmV0LWtleS1ieXRlcw==");
        assert!(!other.verify(VECTOR_ID, ts, VECTOR_BODY, VECTOR_SIGNATURE, VECTOR_TS));
    }

    #[test]
    fn each_secret_adds_a_signature_that_verifies_with_that_secret_alone() {
        let both = secrets(&format!("  {VECTOR_SECRET}   plain-old-secret "));
        assert_eq!(both.len(), 2);
        let header = both.sign_v1(VECTOR_ID, VECTOR_TS, VECTOR_BODY);
        let entries: Vec<&str> = header.split(' ').collect();
        assert_eq!(entries.len(), 2, "{header}");
        assert_eq!(entries[0], VECTOR_SIGNATURE);
        let ts = VECTOR_TS.to_string();
        for single in [VECTOR_SECRET, "plain-old-secret"] {
            assert!(secrets(single).verify(VECTOR_ID, &ts, VECTOR_BODY, &header, VECTOR_TS));
        }
        // A raw secret keys with its bytes: the same tag as an HMAC built here.
        let mut mac = Hmac::<Sha256>::new_from_slice(b"plain-old-secret").expect("key");
        mac.update(format!("{VECTOR_ID}.{VECTOR_TS}.").as_bytes());
        mac.update(VECTOR_BODY);
        let expected = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
        assert_eq!(entries[1], expected);
    }

    #[test]
    fn a_header_of_more_than_ten_entries_is_refused_even_with_the_right_one_among_them() {
        let s = secrets(VECTOR_SECRET);
        let ts = "1614265330";
        let with = |filler: usize| {
            let mut entries = vec!["v1,"; filler];
            entries.push(VECTOR_SIGNATURE);
            entries.join(" ")
        };
        assert!(s.verify(VECTOR_ID, ts, VECTOR_BODY, &with(9), VECTOR_TS));
        assert!(!s.verify(VECTOR_ID, ts, VECTOR_BODY, &with(10), VECTOR_TS));
        assert_eq!(
            v1_candidates(&with(40_000)).map(|_| ()),
            Err(TooManyEntries(40_001))
        );
        // An empty `v1,` decodes to an empty tag, which matches nothing.
        assert!(!s.verify(VECTOR_ID, ts, VECTOR_BODY, "v1,", VECTOR_TS));
    }

    #[test]
    fn x_signature_keys_with_the_first_secret_exactly_as_written() {
        let s = secrets(&format!("{VECTOR_SECRET} second"));
        let mut mac = Hmac::<Sha256>::new_from_slice(VECTOR_SECRET.as_bytes()).expect("key");
        mac.update(b"body");
        let expected = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
        assert_eq!(s.x_signature(b"body"), expected);
        assert!(s.verify_x_signature(b"body", &expected));
        assert!(!s.verify_x_signature(b"other", &expected));
        assert!(!s.verify_x_signature(b"body", "sha256=zz"));
    }

    #[test]
    fn bad_secrets_are_refused_without_repeating_them() {
        assert_eq!(Secrets::parse("   ").map(|_| ()), Err(SecretError::Empty));
        let error = Secrets::parse("good whsec_not*base64!")
            .map(|_| ())
            .expect_err("refused");
        let shown = error.to_string();
        assert!(
            shown.starts_with("secret 2 of 2 starts with whsec_"),
            "{shown}"
        );
        assert!(
            !shown.contains("not*base64") && !shown.contains('*'),
            "{shown}"
        );
        assert!(matches!(
            Secrets::parse("whsec_"),
            Err(SecretError::EmptyKey { position: 1, .. })
        ));
        // Unpadded base64 is accepted: both forms circulate.
        assert!(Secrets::parse("whsec_c2VjcmV0LWtleS1ieXRlcw").is_ok());
        assert!(!format!("{:?}", secrets("hunter2")).contains("hunter2"));
    }
}
