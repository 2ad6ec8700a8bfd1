//! The one error type of the API, and the one place that maps it to a status.
//!
//! Every rejection, from a wrong content type to a database outage, leaves as
//! `{"error":{"code":"...","message":"...","field":"..."}}`; `field` is present
//! on validation errors only.

use std::time::Duration;

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::db::DbError;
use crate::orders::ValidationError;

/// The whole body of every `401` of `/inbound` (DESIGN.md, "Inbox"): the
/// same bytes whatever the reason.
pub const INBOUND_REFUSED_BODY: &str = r#"{"error":{"code":"unauthorized"}}"#;

/// How long a client should wait before retrying a 503.
const RETRY_AFTER_SECONDS: &str = "1";

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("expected Content-Type: application/json, got {}", got.as_deref().unwrap_or("none"))]
    UnsupportedMediaType { got: Option<String> },
    #[error("the body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("the body could not be read: {0}")]
    UnreadableBody(String),
    #[error("the body is not valid JSON: {0}")]
    MalformedJson(String),
    #[error("the Idempotency-Key header {0}")]
    InvalidIdempotencyKey(String),
    #[error("{}", validation_message(.0))]
    Validation(#[from] ValidationError),
    #[error(
        "this Idempotency-Key was already used with a different order or request; \
         use a new key for a new one"
    )]
    IdempotencyConflict,
    #[error("order {order_id} is {current}; it cannot become {requested}")]
    InvalidTransition {
        order_id: i64,
        current: &'static str,
        requested: &'static str,
    },
    /// No key, or one that is malformed, unknown, expired or revoked.
    #[error("{0}")]
    Unauthorized(String),
    /// An inbound message whose source, headers or signature do not check
    /// out. One answer for every reason, so a caller cannot tell an unknown
    /// source from a wrong signature; the reason is logged where it is found.
    #[error("the message is refused")]
    InboundRefused,
    #[error("this API key lacks the scope {scope}")]
    Forbidden { scope: crate::api_keys::Scope },
    #[error("too many requests with this API key; retry in {retry_after_seconds}s")]
    RateLimited { retry_after_seconds: u64 },
    /// Before authentication: this address spent its budget of failed or
    /// unauthenticated requests (`API_ADDRESS_LIMIT`).
    #[error(
        "too many failed or unauthenticated requests from this address; retry in {retry_after_seconds}s"
    )]
    AddressRateLimited { retry_after_seconds: u64 },
    #[error("there is no order {0}")]
    OrderNotFound(String),
    #[error("the receipt of order {0} is not rendered yet; try again later")]
    ReceiptNotReady(i64),
    #[error("{}", link_message(.0))]
    Link(crate::links::LinkError),
    #[error("there is no {0} here")]
    RouteNotFound(String),
    #[error("{method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
    /// The cause is logged, not shown: it may name hosts and users.
    #[error("the database is unavailable; try again shortly")]
    DatabaseUnavailable { cause: String },
    /// A source's secret this process cannot open (`SECRETS_KEY` missing or
    /// wrong): the sender retries later. The cause is logged, not shown.
    #[error("the message cannot be checked right now; try again later")]
    SecretUnavailable(crate::sealed::Unreadable),
    /// A POST that timed out may still commit: retrying it with the same
    /// Idempotency-Key returns the order if it did.
    #[error(
        "the request took longer than {}; if it placed an order, retrying with the same Idempotency-Key returns it",
        humantime::format_duration(*.0)
    )]
    Timeout(Duration),
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

/// What a customer who followed a receipt link is told; the same for a
/// malformed and a tampered link (the logs tell them apart).
fn link_message(error: &crate::links::LinkError) -> &'static str {
    match error {
        crate::links::LinkError::Expired => {
            "this receipt link has expired; ask the shop for a new one"
        }
        crate::links::LinkError::Malformed
        | crate::links::LinkError::Tampered
        | crate::links::LinkError::UnknownKey
        | crate::links::LinkError::TooLong => {
            "this receipt link is not valid; use the link from your email exactly as it is"
        }
    }
}

fn validation_message(error: &ValidationError) -> String {
    if error.field.is_empty() {
        error.message.clone()
    } else {
        format!("{} {}", error.field, error.message)
    }
}

/// The `error` object of a JSON error body.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// Stable and machine-readable: `unauthorized`, `validation_failed`, …
    #[schema(value_type = String)]
    pub code: &'static str,
    pub message: String,
    /// The path of the field at fault, on validation errors only.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub field: Option<String>,
}

/// `{"error": {...}}`, fields in the order people read them.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = Error)]
pub(crate) struct ErrorEnvelope {
    error: ErrorBody,
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::UnsupportedMediaType { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnreadableBody(_)
            | ApiError::MalformedJson(_)
            | ApiError::InvalidIdempotencyKey(_) => StatusCode::BAD_REQUEST,
            ApiError::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::IdempotencyConflict | ApiError::InvalidTransition { .. } => {
                StatusCode::CONFLICT
            }
            ApiError::Unauthorized(_) | ApiError::InboundRefused => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden { .. } => StatusCode::FORBIDDEN,
            ApiError::RateLimited { .. } | ApiError::AddressRateLimited { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ApiError::OrderNotFound(_)
            | ApiError::ReceiptNotReady(_)
            | ApiError::RouteNotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Link(crate::links::LinkError::Expired) => StatusCode::GONE,
            ApiError::Link(_) => StatusCode::FORBIDDEN,
            ApiError::DatabaseUnavailable { .. }
            | ApiError::Timeout(_)
            | ApiError::SecretUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Stable, machine-readable; clients branch on this, not on the message.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::UnsupportedMediaType { .. } => "unsupported_media_type",
            ApiError::PayloadTooLarge { .. } => "payload_too_large",
            ApiError::UnreadableBody(_) => "unreadable_body",
            ApiError::MalformedJson(_) => "malformed_json",
            ApiError::InvalidIdempotencyKey(_) => "invalid_idempotency_key",
            ApiError::Validation(_) => "validation_failed",
            ApiError::IdempotencyConflict => "idempotency_conflict",
            ApiError::InvalidTransition { .. } => "invalid_transition",
            ApiError::Unauthorized(_) | ApiError::InboundRefused => "unauthorized",
            ApiError::Forbidden { .. } => "forbidden",
            ApiError::RateLimited { .. } | ApiError::AddressRateLimited { .. } => "rate_limited",
            ApiError::OrderNotFound(_) => "order_not_found",
            ApiError::ReceiptNotReady(_) => "receipt_not_ready",
            ApiError::RouteNotFound(_) => "not_found",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::Link(crate::links::LinkError::Expired) => "link_expired",
            ApiError::Link(_) => "invalid_link",
            ApiError::DatabaseUnavailable { .. } => "database_unavailable",
            ApiError::Timeout(_) => "timeout",
            ApiError::SecretUnavailable(_) => "unavailable",
            ApiError::Internal(_) => "internal_error",
        }
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            code: self.code(),
            message: self.to_string(),
            field: match self {
                ApiError::Validation(e) => Some(e.field.clone()),
                _ => None,
            },
        }
    }

    /// The message with the causes that the client is not shown, for logs.
    pub fn detail(&self) -> String {
        match self {
            ApiError::Internal(cause) => format!("{cause:#}"),
            ApiError::DatabaseUnavailable { cause } => format!("{self}: {cause}"),
            ApiError::SecretUnavailable(cause) => format!("{self}: {cause}"),
            other => other.to_string(),
        }
    }

    /// Logs the error as its answer is sent: 5xx with their causes, the
    /// rest briefly.
    pub(crate) fn log(&self) {
        match self {
            ApiError::Internal(_) => tracing::error!(error = self.detail(), "request failed"),
            ApiError::DatabaseUnavailable { .. } => {
                tracing::warn!(
                    error = self.detail(),
                    "request failed: database unavailable"
                )
            }
            ApiError::Timeout(limit) => tracing::warn!(?limit, "request timed out"),
            ApiError::SecretUnavailable(_) => tracing::error!(
                error = self.detail(),
                "inbound message not checked: a source's secret cannot be read"
            ),
            ApiError::Link(why) => tracing::info!(error = %why, "receipt link refused"),
            rejected => {
                tracing::debug!(code = rejected.code(), error = %rejected, "request rejected")
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.log();
        if let ApiError::InboundRefused = self {
            return (
                StatusCode::UNAUTHORIZED,
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                INBOUND_REFUSED_BODY,
            )
                .into_response();
        }
        let status = self.status();
        let mut response = (status, Json(ErrorEnvelope { error: self.body() })).into_response();
        let headers = response.headers_mut();
        match &self {
            // RFC 6750: the scheme a client should use.
            ApiError::Unauthorized(_) => {
                headers.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"orders\""),
                );
            }
            ApiError::RateLimited {
                retry_after_seconds,
            }
            | ApiError::AddressRateLimited {
                retry_after_seconds,
            } => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_seconds));
            }
            _ if status == StatusCode::SERVICE_UNAVAILABLE => {
                headers.insert(
                    header::RETRY_AFTER,
                    HeaderValue::from_static(RETRY_AFTER_SECONDS),
                );
            }
            _ => {}
        }
        response
    }
}

impl From<DbError> for ApiError {
    fn from(error: DbError) -> Self {
        // A statement cancelled by the API's statement_timeout was rolled back:
        // like an outage, it is worth retrying and wrote nothing.
        if error.is_unavailable() || error.is_statement_timeout() {
            ApiError::DatabaseUnavailable {
                cause: error.to_string(),
            }
        } else {
            ApiError::Internal(anyhow::Error::new(error).context("database query"))
        }
    }
}

impl From<diesel::result::Error> for ApiError {
    fn from(error: diesel::result::Error) -> Self {
        ApiError::from(DbError::Query(error))
    }
}
