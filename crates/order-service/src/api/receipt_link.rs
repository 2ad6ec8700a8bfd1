//! The signed-link path of `GET /orders/{id}/receipt.pdf`: the
//! `?expires=…&signature=…` that emails carry, checked before the database is
//! touched, and the page a customer sees when a link is refused.

use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{Html, IntoResponse, Response};

use super::error::ApiError;
use crate::links::{LinkError, ReceiptLinks, unix_now};

/// Whether a request came with a signed link, and if so, whether it holds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum LinkCheck {
    /// No `expires` or `signature`: the request has to bring a key instead.
    Absent,
    /// A genuine, unexpired link for this order.
    Valid,
}

/// Checks the signed-link parameters of `query` for order `order_id`. Only
/// one of the two, either one twice, or a link with no signer configured
/// (keys and links turned off) is decided here too: the first two are
/// refused, the last passes as `Absent`.
pub(crate) fn check(
    links: Option<&ReceiptLinks>,
    order_id: i64,
    query: Option<&str>,
) -> Result<LinkCheck, ApiError> {
    let (mut expires, mut kid, mut signature) = (Vec::new(), Vec::new(), Vec::new());
    for (name, value) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match name.as_ref() {
            "expires" => expires.push(value.into_owned()),
            "kid" => kid.push(value.into_owned()),
            "signature" => signature.push(value.into_owned()),
            _ => {}
        }
    }
    if expires.is_empty() && signature.is_empty() {
        return Ok(LinkCheck::Absent);
    }
    let Some(links) = links else {
        return Ok(LinkCheck::Absent);
    };
    let kid = match kid.as_slice() {
        [] => None,
        [kid] => Some(kid.as_str()),
        _ => return Err(ApiError::Link(LinkError::Malformed)),
    };
    match (expires.as_slice(), signature.as_slice()) {
        ([expires], [signature]) => links
            .verify(order_id, expires, kid, signature, unix_now())
            .map(|()| LinkCheck::Valid)
            .map_err(ApiError::Link),
        _ => Err(ApiError::Link(LinkError::Malformed)),
    }
}

/// A refused link as a small HTML page for a browser (a customer clicking in
/// an email), or the API's JSON error for anything else.
pub(crate) fn refusal(error: ApiError, headers: &HeaderMap) -> Response {
    let wants_html = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("text/html"));
    // `Cache-Control: no-store` comes from the route's authorization layer,
    // which sets it on every answer of a route with order data.
    if !wants_html {
        return error.into_response();
    }
    let status = error.status();
    let (title, advice) = match &error {
        ApiError::Link(LinkError::Expired) => (
            "This receipt link has expired",
            "Receipt links in emails work for a limited time. Ask the shop for a new one.",
        ),
        _ => (
            "This receipt link is not valid",
            "It may have been cut short or changed on the way. Open the link from your \
             email exactly as it is, or ask the shop for a new one.",
        ),
    };
    // Logged as the JSON answer would be; the page itself is static text.
    error.log();
    let page = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title}</title></head>\
         <body style=\"font-family: sans-serif; max-width: 32rem; margin: 3rem auto; padding: 0 1rem;\">\
         <h1 style=\"font-size: 1.4rem;\">{title}</h1><p>{advice}</p>\
         <p style=\"color: #666;\">HTTP {}</p></body></html>\n",
        status.as_u16()
    );
    let mut response = (status, Html(page)).into_response();
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'"),
    );
    response
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn links() -> ReceiptLinks {
        ReceiptLinks::new(&[9; 32], Duration::from_secs(600)).expect("key")
    }

    #[test]
    fn no_link_parameters_is_absent_and_a_genuine_link_is_valid() {
        let links = links();
        assert_eq!(check(Some(&links), 5, None).ok(), Some(LinkCheck::Absent));
        assert_eq!(
            check(Some(&links), 5, Some("download=1")).ok(),
            Some(LinkCheck::Absent)
        );
        let query = links.sign(5, unix_now()).query();
        assert_eq!(
            check(Some(&links), 5, Some(&query)).ok(),
            Some(LinkCheck::Valid)
        );
        // Keys and links off: the parameters mean nothing.
        assert_eq!(check(None, 5, Some(&query)).ok(), Some(LinkCheck::Absent));
    }

    #[test]
    fn half_a_link_or_a_repeated_parameter_is_refused() {
        let links = links();
        let link = links.sign(5, unix_now());
        for query in [
            format!("expires={}", link.expires),
            format!("signature={}", link.signature),
            format!("{}&signature=AAAA", link.query()),
        ] {
            let error = check(Some(&links), 5, Some(&query)).expect_err("refused");
            assert!(
                matches!(error, ApiError::Link(LinkError::Malformed)),
                "{query}"
            );
        }
    }
}
