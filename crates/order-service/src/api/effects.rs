//! `GET /orders/{id}/effects`: the order's effect ledger.

use super::auth::Verified;
use super::error::{ApiError, ErrorEnvelope};
use super::orders::read_order;
use super::state::AppState;
use crate::orders::{EffectLedger, load_ledger};
use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Extension, Path, State};

/// `GET /orders/{id}/effects`: with `orders:read:own`, only an order placed
/// with the same key; any other is a 404, as one that does not exist.
#[utoipa::path(
    get,
    path = "/orders/{id}/effects",
    tag = "orders",
    operation_id = "getOrderEffects",
    params(("id" = i64, Path, description = "The order's id", minimum = 1)),
    responses(
        (status = 200, description = "One entry per job of the order, with what its peer answered", body = EffectLedger),
        (status = 403, description = "The key lacks `orders:read` and `orders:read:own`", body = ErrorEnvelope),
        (status = 404, description = "No such order (or, with `orders:read:own`, another key's)", body = ErrorEnvelope),
        super::openapi::Refusals,
    ),
    security(("api_key" = ["orders:read"]), ("api_key" = ["orders:read:own"])),
)]
pub(crate) async fn effects(
    State(state): State<AppState>,
    Extension(verified): Extension<Verified>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<EffectLedger>, ApiError> {
    read_order(&state, verified, id, |conn, id| Ok(load_ledger(conn, id)?)).await
}
