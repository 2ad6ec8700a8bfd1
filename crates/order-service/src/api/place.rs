//! `POST /orders`: the checks of the body, then one statement that writes the
//! order and its jobs on the API's own connection, or the pool's
//! transaction that also tells an idempotent repeat from a conflict.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse as _, Response};

use super::auth::{Provisional, Verified};
use super::body;
use super::error::{ApiError, ErrorEnvelope};
use super::orders::{OrderView, load_view, location};
use super::state::AppState;
use crate::orders::{
    IdempotencyKey, KeyChecked, NewOrder, PlaceOrderError, Placed, Placement, Placing, place_with,
};

/// `POST /orders`. The key was verified before the body was read (`auth`);
/// then checks run cheapest first, and all of them before the order touches
/// the database: content type (415), Idempotency-Key (400), size (413), JSON
/// syntax (400), fields (422). Then one statement writes the order and its
/// jobs, or, for a repeated key, the pool's transaction finds the earlier
/// order.
///
/// A key let in from the cache (`Provisional`) has its row read by the
/// placement's own statement; an answer that statement did not give (a bad
/// body, a repeat, the pool's path) reads the row first, so a key revoked
/// since is `401` whatever else is wrong with the request.
#[utoipa::path(
    post,
    path = "/orders",
    tag = "orders",
    operation_id = "placeOrder",
    request_body(content = crate::orders::OrderBody, content_type = "application/json"),
    params(super::openapi::IdempotencyKeyHeader),
    responses(
        (status = 201, description = "The order, placed", body = OrderView,
            headers(("Location" = String, description = "`/orders/{id}`"))),
        (status = 200, description = "The order placed earlier with this Idempotency-Key", body = OrderView),
        (status = 403, description = "The key lacks `orders:place`", body = ErrorEnvelope),
        (status = 409, description = "This Idempotency-Key was used for another order", body = ErrorEnvelope),
        super::openapi::BodyRefusals,
        super::openapi::Refusals,
    ),
    security(("api_key" = ["orders:place"])),
)]
pub(crate) async fn place(
    State(state): State<AppState>,
    Extension(verified): Extension<Verified>,
    provisional: Option<Extension<Provisional>>,
    headers: HeaderMap,
    raw_body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let mut provisional = provisional.map(|Extension(provisional)| provisional);
    let (key, order) = match checked_body(&headers, raw_body) {
        Ok(checked) => checked,
        Err(error) => {
            if let Some(provisional) = &provisional {
                provisional.confirm(&state.db).await?;
            }
            return Err(error);
        }
    };

    let jobs = state.settings.event_jobs();
    let payment_window = state.settings.payment_window;
    let keyed = key.is_some();
    let enqueuer = state.enqueuer.clone();
    let checking = provisional.is_some();
    let direct = state
        .db
        .direct(async |connection| {
            let placing =
                Placing::new(&order, key.as_ref(), verified.cause(), payment_window, jobs);
            if checking {
                connection.place_as_key(&enqueuer, &placing).await
            } else {
                connection
                    .place(&enqueuer, &placing)
                    .await
                    .map(KeyChecked::Placed)
            }
        })
        .await;
    match direct {
        Some(Ok(KeyChecked::Placed(Some(Placed {
            placement,
            created: Some(created),
        })))) => return Ok(answer(placement, keyed, created.into())),
        // The key holds and nothing was written (its Idempotency-Key was
        // taken): the pool's finds the earlier order, or the conflict.
        Some(Ok(KeyChecked::Placed(_))) => provisional = None,
        Some(Ok(KeyChecked::Refused)) | None => {}
        Some(Err(error)) => return Err(error),
    }
    if let Some(provisional) = &provisional {
        provisional.confirm(&state.db).await?;
    }
    let (placement, view) = state
        .db
        .run(move |conn| {
            let placing =
                Placing::new(&order, key.as_ref(), verified.cause(), payment_window, jobs);
            let placed = place_with(conn, &enqueuer, &placing).map_err(|e| match e {
                PlaceOrderError::IdempotencyConflict { .. } => ApiError::IdempotencyConflict,
                PlaceOrderError::Database(e) => ApiError::from(e),
            })?;
            let placement = placed.placement;
            // A new order is answered with what the placement wrote: reading
            // it back would double the round trips of every placement.
            if let Some(created) = placed.created {
                return Ok((placement, created.into()));
            }
            let id = placement.order_id();
            let view = load_view(conn, id)?.ok_or_else(|| {
                ApiError::Internal(anyhow::anyhow!(
                    "order {id} vanished right after placing it"
                ))
            })?;
            Ok((placement, view))
        })
        .await?;
    Ok(answer(placement, keyed, view))
}

/// The checks of a placement's request that need no database, cheapest
/// first: its Idempotency-Key and its order.
fn checked_body(
    headers: &HeaderMap,
    raw_body: Result<Bytes, BytesRejection>,
) -> Result<(Option<IdempotencyKey>, NewOrder), ApiError> {
    body::require_json(headers)?;
    let key = body::idempotency_key(headers)?;
    let value = body::parse_json(raw_body)?;
    let order = NewOrder::parse(&value)?;
    Ok((key, order))
}

/// A placement's answer: 201 for a new order, 200 for the one placed earlier
/// with the same Idempotency-Key.
fn answer(placement: Placement, keyed: bool, view: OrderView) -> Response {
    let status = match placement {
        Placement::Created(id) => {
            tracing::info!(order_id = id, keyed, "order placed");
            StatusCode::CREATED
        }
        Placement::Existing(id) => {
            tracing::info!(
                order_id = id,
                "order already placed with this Idempotency-Key"
            );
            StatusCode::OK
        }
    };
    let id = placement.order_id();
    (status, [(header::LOCATION, location(id))], Json(view)).into_response()
}
