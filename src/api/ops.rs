//! `GET /healthz` and `GET /metrics`, and the JSON answers for unknown routes
//! and methods.

use axum::Json;
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::IntoResponse;
use diesel::RunQueryDsl as _;

use super::error::ApiError;
use super::state::AppState;
use crate::outbox::queue_depth;
use crate::telemetry::{metrics_handle, prometheus_text};

/// `200 {"status":"ok","database":"up"}` when `SELECT 1` answers; otherwise
/// `503` with `"status":"unavailable"` and the usual `error` object.
pub(crate) async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    let ping = state
        .db
        .run(|conn| {
            diesel::sql_query("SELECT 1").execute(conn)?;
            Ok(())
        })
        .await;
    match ping {
        Ok(()) => (
            StatusCode::OK,
            Json(serde_json::json!({"status": "ok", "database": "up"})),
        ),
        Err(error) => {
            tracing::warn!(error = %error, "health check failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(serde_json::json!({
                    "status": "unavailable",
                    "database": "down",
                    "error": error.body(),
                })),
            )
        }
    }
}

/// Prometheus text. The `outbox_jobs{status}` gauge is re-counted here when
/// older than `queue_depth_ttl`; a failed re-count leaves the old values.
pub(crate) async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let db = state.db.clone();
    state
        .queue_depth
        .refresh_if_stale(|| async move {
            db.run(|conn| Ok(queue_depth(conn)?))
                .await
                .map_err(|e| e.detail())
        })
        .await;
    prometheus_text(metrics_handle().render())
}

pub(crate) async fn route_not_found(uri: Uri) -> ApiError {
    ApiError::RouteNotFound(uri.path().chars().take(200).collect())
}

pub(crate) async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().chars().take(200).collect(),
    }
}
