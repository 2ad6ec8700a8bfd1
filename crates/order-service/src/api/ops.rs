//! `GET /healthz`, and the JSON answers for unknown routes and methods.
//! Metrics are not here: they are served on `METRICS_ADDR` only, never on
//! the public port (they tell the business's volume).

use axum::extract::State;
use axum::http::{Method, Uri};
use axum::response::IntoResponse;

use super::error::ApiError;
use super::state::AppState;

/// The latest health check's outcome (`health`): no database call here.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    operation_id = "health",
    responses(
        (status = 200, description = "The database answers", body = super::openapi::Health),
        (status = 503, description = "It does not", body = super::openapi::Health),
    ),
    security(()),
)]
pub(crate) async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    state.db.health().answer()
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
