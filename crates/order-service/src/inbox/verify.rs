//! Checking an inbound message before it takes a database connection
//! ([`check`]): the source's secrets opened, the signature verified, the
//! body read as JSON, its message id picked, and the message read
//! ([`Message::read`]). The signatures are Stripe's `Stripe-Signature` and
//! Standard Webhooks'. Both compare in constant time (`Mac::verify_slice`)
//! and refuse a timestamp more than [`TOLERANCE_SECS`] from the clock either
//! way: a captured message cannot be replayed later, and the inbox's dedupe
//! covers the window.
//!
//! No header makes a check cost more than a valid message's: the cheap
//! checks (headers present, timestamp, at most [`MAX_SIGNATURE_ENTRIES`]
//! signatures) come first, and the body's MAC is computed once per secret,
//! then compared with each candidate.

use axum::http::HeaderMap;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;

use super::Via;
use super::event::Message;
use super::source::{Source, SourceKind};
use crate::sealed::{Keyring, Unreadable};
pub use crate::signature::MAX_SIGNATURE_ENTRIES;
use crate::signature::{Secrets, TooManyEntries, v1_candidates};

/// How far a message's timestamp may be from the clock, either way.
pub const TOLERANCE_SECS: i64 = 5 * 60;

/// Why a message is refused (`401`). Never carries a secret or a signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("no {0} header")]
    Missing(&'static str),
    #[error("the {0} header is malformed")]
    Malformed(&'static str),
    #[error(
        "the signature's timestamp is {0} seconds from this server's clock (at most 300 allowed)"
    )]
    Stale(i64),
    #[error("the signature header has {0} entries (at most 10 are read)")]
    TooManySignatures(usize),
    #[error("no signature matches the source's secrets")]
    Mismatch,
}

/// What a verified message's headers say, besides its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Standard Webhooks' `webhook-id`; Stripe's id is in the body.
    pub message_id: Option<String>,
}

/// Why [`check`] does not take a message; nothing is stored for any.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The signature does not hold (`401`, one body for all).
    #[error(transparent)]
    Unverified(#[from] VerifyError),
    /// The source's sealed secret cannot be opened with this server's keys
    /// (`503`): the sender retries later.
    #[error(transparent)]
    SecretUnavailable(#[from] Unreadable),
    /// Verified, but not JSON, or no message id in it (`400`).
    #[error("{0}")]
    Malformed(String),
}

/// Checks `body`, received from `source` at `now` with `headers`: the
/// source's secrets at `now` (sealed ones opened with `keys`), the
/// signature, the JSON, the message id (Standard Webhooks' `webhook-id`,
/// Stripe's event `id`), then reads it as a webhook. CPU only: run it off
/// the async threads.
pub fn check(
    source: &Source,
    keys: &Keyring,
    headers: &HeaderMap,
    body: &[u8],
    now: DateTime<Utc>,
) -> Result<Message, Refusal> {
    let secrets = source.secrets_at(keys, now)?;
    let secrets: Vec<&str> = secrets.iter().map(String::as_str).collect();
    let verified = verify(source.kind(), &secrets, headers, body, now.timestamp())?;
    let payload: Value =
        serde_json::from_slice(body).map_err(|e| Refusal::Malformed(e.to_string()))?;
    let message_id = match (source.kind(), verified.message_id) {
        (SourceKind::Standard, Some(id)) => id,
        _ => payload
            .get("id")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| Refusal::Malformed("the event has no \"id\" string".into()))?,
    };
    let (kind, mode) = (source.kind(), source.mode());
    Ok(Message::read(
        &source.name,
        kind,
        mode,
        message_id,
        payload,
        Via::Webhook,
    ))
}

/// Checks `body` against `headers` with `secrets` (the current secret first,
/// then the previous one while it is kept); `now` is Unix seconds.
pub fn verify(
    kind: SourceKind,
    secrets: &[&str],
    headers: &HeaderMap,
    body: &[u8],
    now: i64,
) -> Result<Verified, VerifyError> {
    match kind {
        SourceKind::Stripe => {
            let header = header(headers, "stripe-signature")?;
            verify_stripe(secrets, header, body, now)?;
            Ok(Verified { message_id: None })
        }
        SourceKind::Standard => {
            let id = header(headers, "webhook-id")?;
            let timestamp = header(headers, "webhook-timestamp")?;
            let signature = header(headers, "webhook-signature")?;
            verify_standard(secrets, id, timestamp, signature, body, now)?;
            Ok(Verified {
                message_id: Some(id.to_owned()),
            })
        }
    }
}

fn header<'h>(headers: &'h HeaderMap, name: &'static str) -> Result<&'h str, VerifyError> {
    let value = headers.get(name).ok_or(VerifyError::Missing(name))?;
    value
        .to_str()
        .map_err(|_| VerifyError::Malformed(name))
        .map(str::trim)
}

fn within_tolerance(timestamp: i64, now: i64) -> Result<(), VerifyError> {
    let off = now.saturating_sub(timestamp);
    if off.unsigned_abs() > TOLERANCE_SECS.unsigned_abs() {
        return Err(VerifyError::Stale(off));
    }
    Ok(())
}

/// `Stripe-Signature: t=<unix seconds>,v1=<hex>,v1=<hex>,…`: some `v1` is the
/// HMAC-SHA256 of `"{t}.{body}"` keyed with one of the secrets' bytes as
/// written. Other schemes (`v0`, a test mode's) are ignored, as Stripe's own
/// libraries do.
pub fn verify_stripe(
    secrets: &[&str],
    header: &str,
    body: &[u8],
    now: i64,
) -> Result<(), VerifyError> {
    const NAME: &str = "Stripe-Signature";
    let mut timestamp = None;
    let mut candidates = Vec::new();
    let mut entries = 0;
    for part in header.split(',') {
        let Some((key, value)) = part.trim().split_once('=') else {
            continue;
        };
        match key {
            "t" => timestamp = value.parse::<i64>().ok(),
            "v1" => {
                entries += 1;
                // Past the limit only counted, never decoded.
                if entries <= MAX_SIGNATURE_ENTRIES
                    && let Ok(bytes) = hex::decode(value)
                {
                    candidates.push(bytes);
                }
            }
            _ => {}
        }
    }
    if entries > MAX_SIGNATURE_ENTRIES {
        return Err(VerifyError::TooManySignatures(entries));
    }
    let timestamp = timestamp.ok_or(VerifyError::Malformed(NAME))?;
    if candidates.is_empty() {
        return Err(VerifyError::Malformed(NAME));
    }
    within_tolerance(timestamp, now)?;
    let prefix = format!("{timestamp}.");
    // One MAC of the body per secret; each candidate then costs a clone and
    // a finalization, whatever the body's length.
    let matched = secrets.iter().any(|secret| {
        let Ok(mac) = Hmac::<Sha256>::new_from_slice(secret.as_bytes()) else {
            return false;
        };
        let mac = mac.chain_update(prefix.as_bytes()).chain_update(body);
        candidates
            .iter()
            .any(|candidate| mac.clone().verify_slice(candidate).is_ok())
    });
    if matched {
        Ok(())
    } else {
        Err(VerifyError::Mismatch)
    }
}

/// Standard Webhooks: some `v1,<base64>` in `webhook-signature` is the
/// HMAC-SHA256 of `"{id}.{timestamp}.{body}"` (a `whsec_` secret keyed by its
/// base64 tail), the same check the relay's own deliveries are made for.
pub fn verify_standard(
    secrets: &[&str],
    id: &str,
    timestamp: &str,
    signature: &str,
    body: &[u8],
    now: i64,
) -> Result<(), VerifyError> {
    let parsed = timestamp
        .parse::<i64>()
        .map_err(|_| VerifyError::Malformed("webhook-timestamp"))?;
    within_tolerance(parsed, now)?;
    let candidates =
        v1_candidates(signature).map_err(|TooManyEntries(n)| VerifyError::TooManySignatures(n))?;
    if candidates.is_empty() {
        return Err(VerifyError::Malformed("webhook-signature"));
    }
    let Ok(keys) = Secrets::parse(&secrets.join(" ")) else {
        // A stored secret that does not decode verifies nothing; `sources
        // add` refuses such secrets, so only a hand-edited row gets here.
        return Err(VerifyError::Mismatch);
    };
    if keys.matches_v1(id, parsed, body, &candidates) {
        Ok(())
    } else {
        Err(VerifyError::Mismatch)
    }
}

/// Signs like Stripe does, for tests, the demo and the bench:
/// `t=<timestamp>,v1=<hex HMAC-SHA256 of "{t}.{body}">`.
pub fn stripe_signature(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let mac = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC-SHA256 accepts keys of every length"),
    };
    let tag = mac
        .chain_update(format!("{timestamp}.").as_bytes())
        .chain_update(body)
        .finalize()
        .into_bytes();
    format!("t={timestamp},v1={}", hex::encode(tag))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_test_secret_for_the_inbox";

    #[test]
    fn a_stripe_signature_verifies_with_any_listed_secret_and_v1() {
        let body = br#"{"id":"evt_1","type":"payment_intent.succeeded"}"#;
        let header = stripe_signature(SECRET, 1_700_000_000, body);
        assert_eq!(
            verify_stripe(&[SECRET], &header, body, 1_700_000_100),
            Ok(())
        );
        // During a rotation the provider signs with both: either passes.
        let old = stripe_signature("whsec_old_secret_000000", 1_700_000_000, body);
        let both = format!(
            "{header},{}",
            old.split_once(',').map(|(_, v)| v).unwrap_or("")
        );
        assert_eq!(verify_stripe(&[SECRET], &both, body, 1_700_000_000), Ok(()));
        assert_eq!(
            verify_stripe(&["whsec_other_secret_1234"], &header, body, 1_700_000_000),
            Err(VerifyError::Mismatch)
        );
        assert_eq!(
            verify_stripe(&[SECRET], &header, b"{}", 1_700_000_000),
            Err(VerifyError::Mismatch)
        );
    }

    #[test]
    fn a_signature_header_of_more_than_ten_entries_is_refused_before_any_mac() {
        let body = b"{}";
        let good = stripe_signature(SECRET, 1_700_000_000, body);
        let padded = |filler: usize| format!("{good}{}", ",v1=00".repeat(filler));
        assert_eq!(
            verify_stripe(&[SECRET], &padded(9), body, 1_700_000_000),
            Ok(())
        );
        assert_eq!(
            verify_stripe(&[SECRET], &padded(10), body, 1_700_000_000),
            Err(VerifyError::TooManySignatures(11))
        );
        let standard = format!("{} v1,", "v1, ".repeat(40_000));
        assert_eq!(
            verify_standard(
                &[SECRET],
                "msg_1",
                "1700000000",
                &standard,
                body,
                1_700_000_000
            ),
            Err(VerifyError::TooManySignatures(40_001))
        );
    }

    #[test]
    fn a_stripe_signature_outside_five_minutes_or_malformed_is_refused() {
        let body = b"{}";
        let header = stripe_signature(SECRET, 1_700_000_000, body);
        assert_eq!(
            verify_stripe(&[SECRET], &header, body, 1_700_000_301),
            Err(VerifyError::Stale(301))
        );
        assert_eq!(
            verify_stripe(&[SECRET], &header, body, 1_699_999_699),
            Err(VerifyError::Stale(-301))
        );
        assert_eq!(
            verify_stripe(&[SECRET], "v1=00", body, 1_700_000_000),
            Err(VerifyError::Malformed("Stripe-Signature"))
        );
        assert_eq!(
            verify_stripe(&[SECRET], "t=1700000000", body, 1_700_000_000),
            Err(VerifyError::Malformed("Stripe-Signature"))
        );
    }
}
