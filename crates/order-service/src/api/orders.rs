//! `POST /orders`, `GET /orders/{id}`, `GET /orders/{id}/receipt.pdf`.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use diesel::prelude::*;
use serde::Serialize;

use super::ApiAuth;
use super::auth::{Reads, ReceiptAccess, Verified};
use super::body;
use super::error::{ApiError, ErrorEnvelope};
use super::receipt_link::{self, LinkCheck};
use super::state::AppState;
use crate::orders::{
    Order, OrderEvent, OrderId, OrderJob, OrderStatus, PlacedOrder, Transition, TransitionError,
    TransitionOutcome, load_order, load_order_events, load_order_jobs, transition_order_by,
};
use crate::schema::{orders, receipts};

/// The order as the API shows it: the order's own fields at the top level,
/// with its `items` and its `jobs`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OrderView {
    #[serde(flatten)]
    pub order: Order,
    pub jobs: Vec<OrderJob>,
    /// The order's history, in `seq` order.
    pub events: Vec<OrderEvent>,
}

impl From<PlacedOrder> for OrderView {
    fn from(created: PlacedOrder) -> Self {
        OrderView {
            order: created.order,
            jobs: created.jobs,
            events: created.events,
        }
    }
}

/// Whether order `order_id` exists and `reader` may read it (see
/// [`Verified::may_read`]).
pub(super) fn readable(
    conn: &mut PgConnection,
    reader: Verified,
    order_id: i64,
) -> Result<bool, ApiError> {
    match reader.reads {
        Reads::All => return Ok(true),
        Reads::Nothing => return Ok(false),
        Reads::Own => {}
    }
    let placed_by: Option<Option<i64>> = orders::table
        .find(order_id)
        .select(orders::api_key_id)
        .first(conn)
        .optional()?;
    Ok(placed_by.is_some_and(|placed_by| reader.may_read(placed_by)))
}

/// Reads an order and its jobs under one snapshot, so the jobs shown are the
/// jobs of the order shown.
pub(super) fn load_view(
    conn: &mut PgConnection,
    order_id: i64,
) -> Result<Option<OrderView>, ApiError> {
    let order_id = OrderId::new(order_id);
    Ok(conn
        .build_transaction()
        .read_only()
        .repeatable_read()
        .run(|conn| {
            let Some(order) = load_order(conn, order_id)? else {
                return Ok(None);
            };
            let jobs = load_order_jobs(conn, order_id)?;
            let events = load_order_events(conn, order_id)?;
            Ok::<_, diesel::result::Error>(Some(OrderView {
                order,
                jobs,
                events,
            }))
        })?)
}

pub(super) fn location(order_id: i64) -> HeaderValue {
    // Digits and slashes only: always a valid header value.
    HeaderValue::from_str(&format!("/orders/{order_id}")).unwrap_or(HeaderValue::from_static("/"))
}

/// What a transition answers: the whole order to a key that may read it,
/// else only its id and new status (a key with `orders:ship` alone learns
/// nothing of the customer).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum TransitionAnswer {
    Order(OrderView),
    Status(OrderIdAndStatus),
}

/// An order as a key that may move it, but not read it, sees it. No other
/// field (`additionalProperties: false`), so that the whole order never
/// matches this shape too.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OrderIdAndStatus {
    #[schema(value_type = i64)]
    pub id: OrderId,
    pub status: OrderStatus,
}

/// `POST /orders/{id}/pay`, `/ship`, `/deliver`, `/cancel`: the same checks as
/// `POST /orders`, in the same order, then one transaction that moves the
/// order, records the event and enqueues its jobs. `200` with the order, or
/// only its id and status for a key that may not read it.
#[utoipa::path(
    post,
    path = "/orders/{id}/{action}",
    tag = "orders",
    operation_id = "transitionOrder",
    params(
        ("id" = i64, Path, description = "The order's id", minimum = 1),
        ("action" = super::openapi::Action, Path, description = "The transition"),
        super::openapi::IdempotencyKeyHeader,
    ),
    request_body(
        content = super::openapi::TransitionBody,
        content_type = "application/json",
        description = "The body of the action: `pay` takes `payment_reference`, `ship` `carrier` and `tracking_number`, `cancel` `reason`, `refund` `reason` and `payment_reference` (both optional), `deliver` nothing",
    ),
    responses(
        (status = 200, description = "The order, moved: whole for a key with `orders:read` (or `orders:read:own`, for its own order), else `{\"id\",\"status\"}`", body = TransitionAnswer),
        (status = 403, description = "The key lacks the action's scope", body = ErrorEnvelope),
        (status = 404, description = "No such order", body = ErrorEnvelope),
        (status = 409, description = "The order's status does not allow it, or the Idempotency-Key was used for another request", body = ErrorEnvelope),
        super::openapi::BodyRefusals,
        super::openapi::Refusals,
    ),
    security(("api_key" = ["orders:pay", "orders:ship", "orders:deliver", "orders:cancel", "orders:refund"])),
)]
pub(crate) async fn transition(
    State(state): State<AppState>,
    Extension(verified): Extension<Verified>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    raw_body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let Path((raw_id, action)) =
        path.map_err(|_| ApiError::OrderNotFound("<unreadable id>".into()))?;
    if !Transition::ACTIONS.contains(&action.as_str()) {
        return Err(ApiError::RouteNotFound(format!(
            "/orders/{}/{}",
            raw_id.chars().take(40).collect::<String>(),
            action.chars().take(40).collect::<String>()
        )));
    }
    let (raw, id) = order_id(Ok(Path(raw_id)))?;
    body::require_json(&headers)?;
    let key = body::idempotency_key(&headers)?;
    let value = body::parse_json(raw_body)?;
    let transition = Transition::parse(&action, &value)?;

    let jobs = state.settings.event_jobs();
    let enqueuer = state.enqueuer.clone();
    let (outcome, answer) = state
        .db
        .run(move |conn| {
            let outcome = transition_order_by(
                conn,
                &enqueuer,
                id,
                &transition,
                key.as_ref(),
                jobs,
                verified.cause(),
            )
            .map_err(|e| match e {
                TransitionError::NotFound(_) => ApiError::OrderNotFound(raw),
                TransitionError::Invalid {
                    order_id,
                    current,
                    requested,
                } => ApiError::InvalidTransition {
                    order_id,
                    current: current.as_str(),
                    requested: requested.as_str(),
                },
                TransitionError::IdempotencyConflict => ApiError::IdempotencyConflict,
                TransitionError::Database(e) => ApiError::from(e),
            })?;
            let view = load_view(conn, id)?.ok_or_else(|| {
                ApiError::Internal(anyhow::anyhow!(
                    "order {id} vanished right after its transition"
                ))
            })?;
            let answer = if readable(conn, verified, id)? {
                TransitionAnswer::Order(view)
            } else {
                TransitionAnswer::Status(OrderIdAndStatus {
                    id: view.order.id,
                    status: view.order.status,
                })
            };
            Ok((outcome, answer))
        })
        .await?;
    match outcome {
        TransitionOutcome::Applied { event_id } => {
            tracing::info!(order_id = id, event_id, action = %action, "order transition");
        }
        TransitionOutcome::Repeated { event_id } => {
            tracing::info!(
                order_id = id,
                event_id,
                "transition already applied with this Idempotency-Key"
            );
        }
    }
    Ok((StatusCode::OK, Json(answer)).into_response())
}

/// `GET /orders/{id}`: with `orders:read:own`, only an order placed with
/// the same key; any other is a 404, as one that does not exist.
#[utoipa::path(
    get,
    path = "/orders/{id}",
    tag = "orders",
    operation_id = "getOrder",
    params(("id" = i64, Path, description = "The order's id", minimum = 1)),
    responses(
        (status = 200, description = "The order, its events and its jobs", body = OrderView),
        (status = 403, description = "The key lacks `orders:read` and `orders:read:own`", body = ErrorEnvelope),
        (status = 404, description = "No such order (or, with `orders:read:own`, another key's)", body = ErrorEnvelope),
        super::openapi::Refusals,
    ),
    security(("api_key" = ["orders:read"]), ("api_key" = ["orders:read:own"])),
)]
pub(crate) async fn show(
    State(state): State<AppState>,
    Extension(verified): Extension<Verified>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<OrderView>, ApiError> {
    read_order(&state, verified, id, load_view).await
}

/// Order `id` as `load` reads it, for a key that may read that order; a 404
/// for an id that names none, or one the key may not read.
pub(super) async fn read_order<T, F>(
    state: &AppState,
    verified: Verified,
    id: Result<Path<String>, PathRejection>,
    load: F,
) -> Result<Json<T>, ApiError>
where
    F: Fn(&mut PgConnection, i64) -> Result<Option<T>, ApiError> + Send + 'static,
    T: Send + 'static,
{
    let (raw, id) = order_id(id)?;
    state
        .db
        .read(move |conn| {
            if !readable(conn, verified, id)? {
                return Ok(None);
            }
            load(conn, id)
        })
        .await?
        .map(Json)
        .ok_or(ApiError::OrderNotFound(raw))
}

/// `GET /orders/{id}/receipt.pdf`: the stored PDF, or 404 until the
/// receipt_pdf job has written it. With a key (`orders:read`), or with a
/// signed link from an email (`?expires=…&signature=…`), checked first:
/// refused, it is a page saying why (403, or 410 once expired), and the
/// database is never asked.
#[utoipa::path(
    get,
    path = "/orders/{id}/receipt.pdf",
    tag = "orders",
    operation_id = "getReceipt",
    params(
        ("id" = i64, Path, description = "The order's id", minimum = 1),
        ("expires" = Option<i64>, Query, description = "A signed link's expiry (unix seconds), as written into emails"),
        ("signature" = Option<String>, Query, description = "A signed link's signature"),
    ),
    responses(
        (status = 200, description = "The receipt", content_type = "application/pdf", body = Vec<u8>),
        (status = 403, description = "A key without `orders:read`, or a changed link", body = ErrorEnvelope),
        (status = 404, description = "No such order, or no receipt yet", body = ErrorEnvelope),
        (status = 410, description = "An expired link", body = ErrorEnvelope),
        super::openapi::Refusals,
    ),
    security(("api_key" = ["orders:read"]), ("api_key" = ["orders:read:own"]), ()),
)]
pub(crate) async fn receipt(
    State(state): State<AppState>,
    Extension(access): Extension<ReceiptAccess>,
    id: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (raw, id) = order_id(id)?;
    let reader = match access {
        ReceiptAccess::Caller(verified) => verified,
        ReceiptAccess::SignedLink => {
            match receipt_link::check(state.settings.receipt_links.as_ref(), id, query.as_deref()) {
                // A valid link opens this one receipt without a key.
                Ok(LinkCheck::Valid) => Verified::ANYONE,
                // No link signer: only with keys off (API_AUTH=none), when
                // every receipt is open anyway.
                Ok(LinkCheck::Absent) if state.settings.auth == ApiAuth::None => Verified::ANYONE,
                Ok(LinkCheck::Absent) => {
                    return Err(ApiError::Unauthorized(
                        "this route needs an API key or a signed link".to_owned(),
                    ));
                }
                Err(refused) => return Ok(receipt_link::refusal(refused, &headers)),
            }
        }
    };
    let pdf = state
        .db
        .run(move |conn| {
            if !readable(conn, reader, id)? {
                return Err(ApiError::OrderNotFound(raw));
            }
            let pdf: Option<Vec<u8>> = receipts::table
                .find(id)
                .select(receipts::pdf)
                .first(conn)
                .optional()?;
            if let Some(pdf) = pdf {
                return Ok(pdf);
            }
            let exists: bool =
                diesel::select(diesel::dsl::exists(orders::table.find(id))).get_result(conn)?;
            if exists {
                Err(ApiError::ReceiptNotReady(id))
            } else {
                Err(ApiError::OrderNotFound(raw))
            }
        })
        .await?;
    let disposition = HeaderValue::from_str(&format!("inline; filename=\"receipt-{id}.pdf\""))
        .unwrap_or(HeaderValue::from_static("inline"));
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/pdf"),
            ),
            (header::CONTENT_DISPOSITION, disposition),
            // A customer's receipt: never kept by a shared cache.
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        pdf,
    )
        .into_response())
}

/// An order id from the path. Anything that is not a positive integer names
/// no order, so it is a 404 like any unknown id.
pub(super) fn order_id(
    path: Result<Path<String>, PathRejection>,
) -> Result<(String, i64), ApiError> {
    let Path(raw) = path.map_err(|_| ApiError::OrderNotFound("<unreadable id>".into()))?;
    match raw.parse::<i64>() {
        Ok(id) if id > 0 => Ok((raw, id)),
        // Echoed back in the message: bounded, whatever the client sent.
        _ => Err(ApiError::OrderNotFound(raw.chars().take(40).collect())),
    }
}
