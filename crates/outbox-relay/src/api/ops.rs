//! `GET /healthz` and `GET /metrics`, and the JSON answers for unknown routes
//! and methods.

use axum::extract::State;
use axum::http::{Method, Uri};
use axum::response::IntoResponse;
use diesel::RunQueryDsl as _;

use super::error::ApiError;
use super::state::AppState;
use crate::outbox::queue_depth;
use crate::telemetry::{health_answer, metrics_handle, prometheus_text};

/// [`health_answer`] for a `SELECT 1` through the API's database runner.
pub(crate) async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    let ping = state
        .db
        .run(|conn| {
            diesel::sql_query("SELECT 1").execute(conn)?;
            Ok(())
        })
        .await;
    health_answer(
        ping.err()
            .map(|error| serde_json::to_value(error.body()).unwrap_or_default()),
    )
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
