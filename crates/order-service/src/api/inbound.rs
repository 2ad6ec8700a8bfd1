//! `POST /inbound/{source}`: a payment provider's signed webhook.
//!
//! No API key: the source's signature is the authentication, checked before
//! the body is read as anything and before the request takes a database
//! connection. The source comes from the [`SourceCache`] (at most
//! [`SOURCE_CACHE_TTL`](crate::inbox::source_cache::SOURCE_CACHE_TTL) old),
//! and the check runs on a blocking thread, at most [`MAX_CHECKS`](crate::inbox::source_cache::MAX_CHECKS) at once,
//! so it never stalls the async threads. Only a verified message goes on to
//! the database, to be recorded and applied.
//!
//! Refusals write nothing: an unknown source, a missing header, a wrong
//! signature, more than ten signatures or a timestamp more than five minutes
//! off is `401` with one body for all ([`ApiError::InboundRefused`]; the
//! reason goes to the log), and spends the address's budget of failed
//! requests like any 401; a body over [`MAX_INBOUND_BYTES`] is `413`; a
//! verified body that is not JSON is `400`; a source whose sealed secret this
//! server cannot open (`SECRETS_KEY` missing or wrong) is `503`, saying
//! nothing of why. Every verified message is recorded once and answered
//! `200 {"status": …}`, whatever it did: the provider must stop retrying a
//! message the shop has kept, even one an operator has yet to decide.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, FailedToBufferBody};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::error::ApiError;
use super::state::AppState;
use crate::inbox::MAX_INBOUND_BYTES;
use crate::inbox::apply::{Answer, receive};
use crate::inbox::source;
use crate::inbox::verify::{Refusal, check};

/// Logs why a message is refused, and the one answer every refusal gets.
fn refuse(name: &str, reason: &str) -> ApiError {
    tracing::warn!(
        source = %crate::text::one_line(name, 64),
        reason,
        "inbound message refused"
    );
    ApiError::InboundRefused
}

#[utoipa::path(
    post,
    path = "/inbound/{source}",
    tag = "inbox",
    operation_id = "receiveInbound",
    params(("source" = String, Path, description = "The source's name (`sources add`)")),
    request_body(
        content = Object,
        content_type = "application/json",
        description = "The provider's event, exactly as it signed it (Stripe-Signature, or Standard Webhooks' webhook-id, webhook-timestamp and webhook-signature)",
    ),
    responses(
        (status = 200, description = "Verified and stored once (a repeat changes nothing)", body = super::openapi::InboundAnswer),
        (status = 400, description = "Verified, but not JSON", body = super::error::ErrorEnvelope),
        (status = 401, description = "No or a wrong signature, more than 10 signatures, an unknown source, or a timestamp over 5 minutes off: one body for all; nothing stored", body = super::openapi::InboundRefusal),
        (status = 413, description = "A body over 256 KiB", body = super::error::ErrorEnvelope),
        (status = 503, description = "The source's secret cannot be read now (the server's SECRETS_KEY); nothing stored, retry later", body = super::error::ErrorEnvelope),
    ),
    security(()),
)]
pub(crate) async fn inbound(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|rejection| match rejection {
        BytesRejection::FailedToBufferBody(FailedToBufferBody::LengthLimitError(_)) => {
            ApiError::PayloadTooLarge {
                limit: MAX_INBOUND_BYTES,
            }
        }
        other => ApiError::UnreadableBody(other.body_text()),
    })?;
    let db = state.db.clone();
    let source = state
        .inbound
        .sources
        .find(&name, || async move {
            db.run(|conn| Ok(source::list(conn)?)).await
        })
        .await?
        .ok_or_else(|| refuse(&name, "no such source"))?;
    let keys = state.settings.secrets.clone();
    let turn = Arc::clone(&state.inbound.checks)
        .acquire_owned()
        .await
        .map_err(|e| ApiError::Internal(e.into()))?;
    // The secrets' opening, the MACs and the JSON parse, off the async
    // threads; a refusal leaves here without touching the database, its
    // WARN inside the request's span, with its trace id.
    let span = tracing::Span::current();
    let message = tokio::task::spawn_blocking(move || {
        let _turn = turn;
        let _span = span.enter();
        check(&source, &keys, &headers, &body, chrono::Utc::now()).map_err(
            |refusal| match refusal {
                Refusal::Unverified(why) => refuse(&source.name, &why.to_string()),
                Refusal::SecretUnavailable(cause) => ApiError::SecretUnavailable(cause),
                Refusal::Malformed(why) => ApiError::MalformedJson(why),
            },
        )
    })
    .await
    .map_err(|e| ApiError::Internal(e.into()))??;

    let enqueuer = state.enqueuer.clone();
    let jobs = state.settings.event_jobs();
    let answer = state
        .db
        .run(move |conn| Ok(receive(conn, &enqueuer, &message, jobs)?))
        .await?;
    let mut body = json!({ "status": answer.status_word() });
    if let Answer::Recorded {
        reason: Some(reason),
        ..
    } = &answer
    {
        body["reason"] = Value::String(reason.clone());
    }
    Ok(Json(body).into_response())
}
