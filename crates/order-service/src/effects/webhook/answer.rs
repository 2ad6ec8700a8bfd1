//! What a receiver's answer means: retry or give up, how long it asks us to
//! wait, and what of its body is worth keeping.

use std::time::{Duration, SystemTime};

use reqwest::StatusCode;

use super::super::EffectError;
use super::EXCERPT_CHARS;
use crate::text::one_line;

/// Bytes of an answer's body read at all: a receiver's huge error page is not
/// worth the memory or the wait.
pub const MAX_ANSWER_BYTES: usize = 8 * 1024;

/// The error class of a non-2xx answer.
pub(super) fn classify(
    status: StatusCode,
    retry_after: Option<Duration>,
    location: Option<&str>,
    body: &str,
) -> EffectError {
    let mut message = format!("webhook receiver answered {status}");
    if let Some(location) = location.filter(|_| status.is_redirection()) {
        message.push_str(&format!(
            " redirecting to {location} (redirects are not followed; update WEBHOOK_URL)"
        ));
    }
    if body.is_empty() {
        message.push_str(" with an empty body");
    } else {
        message.push_str(&format!(": {body}"));
    }
    let retryable = status.is_server_error()
        || matches!(
            status,
            StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_EARLY | StatusCode::TOO_MANY_REQUESTS
        );
    if retryable {
        if let Some(wait) = retry_after {
            message.push_str(&format!(
                " (Retry-After {})",
                humantime::format_duration(wait)
            ));
        }
        EffectError::Retryable {
            message,
            retry_after,
        }
    } else {
        EffectError::Permanent { message }
    }
}

/// What was read of an answer's body.
pub(super) struct AnswerBody {
    /// A short, single-line excerpt.
    pub(super) excerpt: String,
    /// SHA-256 (hex) of the bytes read, when asked for: the effect ledger
    /// records it for the answer that ended the job done.
    pub(super) sha256: Option<String>,
}

/// Reads at most [`MAX_ANSWER_BYTES`] bytes of the answer: an excerpt of them,
/// and, with `digest`, their SHA-256. A body that fails half-way yields what
/// arrived.
pub(super) async fn read_body(mut response: reqwest::Response, digest: bool) -> AnswerBody {
    let mut bytes = Vec::new();
    while bytes.len() < MAX_ANSWER_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    bytes.truncate(MAX_ANSWER_BYTES);
    AnswerBody {
        excerpt: one_line(&String::from_utf8_lossy(&bytes), EXCERPT_CHARS),
        sha256: digest.then(|| crate::effects::ledger::sha256_hex(&bytes)),
    }
}

/// A `Retry-After` value as a wait from `now`: delta-seconds or an HTTP date
/// (RFC 9110, 10.2.3). A date in the past means "now"; garbage means no wish.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Too many digits for u64 is still "a very long time"; the relay caps it.
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_classified_as_the_design_says() {
        let retryable = [408, 425, 429, 500, 502, 503, 504, 599];
        let permanent = [
            300, 301, 302, 307, 400, 401, 403, 404, 409, 410, 413, 422, 451,
        ];
        for code in retryable {
            let status = StatusCode::from_u16(code).expect("status");
            assert!(
                matches!(
                    classify(status, None, None, ""),
                    EffectError::Retryable { .. }
                ),
                "{code}"
            );
        }
        for code in permanent {
            let status = StatusCode::from_u16(code).expect("status");
            assert!(
                matches!(
                    classify(status, Some(Duration::from_secs(5)), None, ""),
                    EffectError::Permanent { .. }
                ),
                "{code}"
            );
        }
    }

    #[test]
    fn messages_carry_the_status_the_body_and_the_wait() {
        let error = classify(
            StatusCode::TOO_MANY_REQUESTS,
            Some(Duration::from_secs(30)),
            None,
            "slow down",
        );
        assert_eq!(
            error,
            EffectError::Retryable {
                message: "webhook receiver answered 429 Too Many Requests: slow down \
                          (Retry-After 30s)"
                    .to_owned(),
                retry_after: Some(Duration::from_secs(30)),
            }
        );
        let moved = classify(
            StatusCode::MOVED_PERMANENTLY,
            None,
            Some("https://new.example.com/hook"),
            "",
        );
        assert!(
            moved
                .to_string()
                .contains("301 Moved Permanently redirecting to https://new.example.com/hook"),
            "{moved}"
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        let cases = [
            ("120", Some(Duration::from_secs(120))),
            (" 0 ", Some(Duration::ZERO)),
            (
                "99999999999999999999999",
                Some(Duration::from_secs(u64::MAX)),
            ),
            // 1_445_412_480 is Wed, 21 Oct 2015 07:28:00 GMT.
            (
                "Wed, 21 Oct 2015 07:28:30 GMT",
                Some(Duration::from_secs(30)),
            ),
            ("Wed, 21 Oct 2015 07:00:00 GMT", Some(Duration::ZERO)),
            ("-5", None),
            ("1.5", None),
            ("soon", None),
            ("", None),
        ];
        for (value, expected) in cases {
            assert_eq!(parse_retry_after(value, now), expected, "{value:?}");
        }
    }
}
