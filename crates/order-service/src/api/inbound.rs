//! `POST /inbound/{source}`: a payment provider's signed webhook.
//!
//! No API key: the source's signature is the authentication, checked before
//! the body is read as anything. Refusals write nothing: an unknown source,
//! a missing or wrong signature, or a timestamp more than five minutes off is
//! `401`; a body over [`MAX_INBOUND_BYTES`] is `413`; a verified body that is
//! not JSON is `400`; a source whose sealed secret this server cannot open
//! (`SECRETS_KEY` missing or wrong) is `503`, saying nothing of why. Every verified message is recorded once and answered
//! `200 {"status": …}`, whatever it did: the provider must stop retrying a
//! message the shop has kept, even one an operator has yet to decide.

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
use crate::inbox::apply::{Answer, Inbound, receive};
use crate::inbox::source::{self, SourceKind};
use crate::inbox::verify::verify;

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
        (status = 401, description = "No or a wrong signature, an unknown source, or a timestamp over 5 minutes off; nothing stored", body = super::error::ErrorEnvelope),
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
    let enqueuer = state.enqueuer.clone();
    let max_attempts = state.settings.max_attempts;
    let keys = state.settings.secrets.clone();
    let answer = state
        .db
        .run(move |conn| {
            let refused = |why: String| ApiError::SignatureRefused(why);
            let source = source::find(conn, &name)?.ok_or_else(|| {
                refused(format!(
                    "unknown source {:?}",
                    crate::text::one_line(&name, 64)
                ))
            })?;
            let now = chrono::Utc::now();
            let secrets = source
                .secrets_at(&keys, now)
                .map_err(ApiError::SecretUnavailable)?;
            let secrets: Vec<&str> = secrets.iter().map(String::as_str).collect();
            let verified = verify(source.kind(), &secrets, &headers, &body, now.timestamp())
                .map_err(|e| refused(e.to_string()))?;
            let payload: Value = serde_json::from_slice(&body)
                .map_err(|e| ApiError::MalformedJson(e.to_string()))?;
            let message_id = match (source.kind(), verified.message_id) {
                (SourceKind::Standard, Some(id)) => id,
                _ => payload
                    .get("id")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .ok_or_else(|| {
                        ApiError::MalformedJson("the event has no \"id\" string".into())
                    })?,
            };
            Ok(receive(
                conn,
                &enqueuer,
                Inbound {
                    source: &source.name,
                    kind: source.kind(),
                    mode: source.mode(),
                    message_id: &message_id,
                    payload: &payload,
                },
                max_attempts,
            )?)
        })
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
