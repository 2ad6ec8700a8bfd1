//! Reading a request's JSON body by hand (headers, bytes, `serde_json::Value`),
//! so every way a body can be wrong is an [`ApiError`] and so a JSON error,
//! never axum's plain-text rejections.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, FailedToBufferBody};
use axum::http::{HeaderMap, header};

use super::error::ApiError;
use crate::orders::IdempotencyKey;

/// Largest accepted body: over 64 KiB is 413 (docs/api.md).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// `application/json`, optionally with `charset=utf-8` (JSON is UTF-8 by
/// definition, RFC 8259); anything else is 415.
pub fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let unsupported = |got: Option<&str>| ApiError::UnsupportedMediaType {
        got: got.map(str::to_owned),
    };
    let Some(raw) = headers.get(header::CONTENT_TYPE) else {
        return Err(unsupported(None));
    };
    let value = raw.to_str().map_err(|_| unsupported(Some("<not ASCII>")))?;
    let mut parts = value.split(';');
    let essence = parts.next().unwrap_or_default().trim();
    if !essence.eq_ignore_ascii_case("application/json") {
        return Err(unsupported(Some(value)));
    }
    for parameter in parts {
        let (name, val) = parameter.split_once('=').unwrap_or((parameter, ""));
        if name.trim().eq_ignore_ascii_case("charset")
            && !val.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        {
            return Err(unsupported(Some(value)));
        }
    }
    Ok(())
}

/// The body as JSON. `body` is axum's buffered body, limited to
/// [`MAX_BODY_BYTES`] by the router's `DefaultBodyLimit`.
pub fn parse_json(body: Result<Bytes, BytesRejection>) -> Result<serde_json::Value, ApiError> {
    let bytes = body.map_err(|rejection| match rejection {
        BytesRejection::FailedToBufferBody(FailedToBufferBody::LengthLimitError(_)) => {
            ApiError::PayloadTooLarge {
                limit: MAX_BODY_BYTES,
            }
        }
        other => ApiError::UnreadableBody(other.body_text()),
    })?;
    serde_json::from_slice(&bytes).map_err(|e| ApiError::MalformedJson(e.to_string()))
}

/// The optional `Idempotency-Key` header, parsed.
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, ApiError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(raw) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::InvalidIdempotencyKey(
            "must be sent at most once".into(),
        ));
    }
    let text = raw.to_str().map_err(|_| {
        ApiError::InvalidIdempotencyKey("must be printable ASCII without spaces".into())
    })?;
    IdempotencyKey::parse(text)
        .map(Some)
        .map_err(ApiError::InvalidIdempotencyKey)
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn with_content_type(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_str(value).expect("header value"),
        );
        headers
    }

    #[test]
    fn json_content_types_are_accepted_with_or_without_utf8_charset() {
        for ok in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
            "application/json;charset=\"UTF-8\"",
        ] {
            assert!(require_json(&with_content_type(ok)).is_ok(), "{ok}");
        }
    }

    #[test]
    fn other_content_types_and_charsets_are_unsupported() {
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "application/json-seq",
            "application/json; charset=latin1",
            "",
        ] {
            let err = require_json(&with_content_type(bad)).expect_err(bad);
            assert_eq!(err.code(), "unsupported_media_type", "{bad}");
        }
        let err = require_json(&HeaderMap::new()).expect_err("missing");
        assert!(err.to_string().contains("got none"), "{err}");
    }

    #[test]
    fn malformed_json_is_a_400_with_serdes_reason() {
        let err = parse_json(Ok(Bytes::from_static(b"{\"a\":"))).expect_err("malformed");
        assert_eq!(err.status(), axum::http::StatusCode::BAD_REQUEST);
        assert!(err.to_string().contains("EOF"), "{err}");
    }
}
