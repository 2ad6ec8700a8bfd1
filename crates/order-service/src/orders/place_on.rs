//! `place_order` on a tokio-postgres client outside any transaction: the
//! API's own connections (`api/direct.rs`), with the statement prepared on
//! each. The same binds as the pool's path (`place.rs`), in the same order.

use tokio_postgres::types::{ToSql, Type};
use tracing::Instrument as _;

use super::idempotency::IdempotencyKey;
use super::jobs::{ConfirmationEmail, OrderFanout, OrderPublish, OrderWebhook, ReceiptPdf};
use super::place::{PLACE_ORDER_PARAMS, Placed, PlacedRow, Placing, placed};
use super::{OrderId, OrderStatus};
use crate::outbox::{Enqueuer, OwnInsert};
use crate::worker::JobArgs as _;

/// [`PLACE_ORDER_SQL`](super::place::PLACE_ORDER_SQL) with the key's row
/// checked in the same statement, and its parameters' types.
pub(crate) const PLACE_ORDER_AS_KEY_SQL: &str = include_str!("sql/place_order_as_key.sql");

pub(crate) fn place_order_as_key_params() -> Vec<Type> {
    let mut params = PLACE_ORDER_PARAMS.to_vec();
    params.push(Type::TEXT_ARRAY);
    params
}

/// What a placement whose key was checked in its statement did.
#[derive(Debug)]
pub(crate) enum KeyChecked {
    /// The key's row refused it: nothing was written.
    Refused,
    /// The key holds; `None` when the idempotency key was taken, as from
    /// [`place_order_on`].
    Placed(Option<Placed>),
}

impl PlacedRow {
    /// The row as a tokio-postgres client read it; `None` for a placement
    /// that wrote nothing (a null `order_id`).
    fn from_row(row: &tokio_postgres::Row) -> Result<Option<PlacedRow>, tokio_postgres::Error> {
        let Some(order_id) = row.try_get::<_, Option<i64>>("order_id")? else {
            return Ok(None);
        };
        Ok(Some(PlacedRow {
            order_id: OrderId::new(order_id),
            created_at: row.try_get("created_at")?,
            expires_at: row.try_get("expires_at")?,
            item_ids: row.try_get("item_ids")?,
            event_id: row.try_get("event_id")?,
            job_ids: row.try_get("job_ids")?,
            job_kinds: row.try_get("job_kinds")?,
        }))
    }
}

/// Runs a placement's `statement` with the binds of `placing`, and `extra`
/// after them: `None` when it returned no row.
async fn insert_placed_on(
    client: &tokio_postgres::Client,
    statement: &tokio_postgres::Statement,
    placing: &Placing<'_>,
    own: &OwnInsert,
    extra: Option<&(dyn ToSql + Sync)>,
) -> Result<Option<tokio_postgres::Row>, tokio_postgres::Error> {
    let order = placing.order;
    let c = placing.columns();
    let total = order.total().cents();
    let key = placing.key.as_ref().map(IdempotencyKey::as_str);
    let request_hash = placing.request_hash.as_deref();
    let params: [&(dyn ToSql + Sync); 22] = [
        &order.customer_email.as_str(),
        &order.customer_name.as_str(),
        &order.currency.code(),
        &total,
        &key,
        &request_hash,
        &placing.cause.api_key_id,
        &c.skus,
        &c.names,
        &c.quantities,
        &c.prices,
        &OrderStatus::Placed.event_type(),
        &c.window_ms,
        &placing.jobs.max_attempts,
        &c.fanout_inline,
        &own.trace_context(),
        &own.notify_channel(),
        &ConfirmationEmail::KIND,
        &ReceiptPdf::KIND,
        &OrderWebhook::KIND,
        &OrderPublish::KIND,
        &OrderFanout::KIND,
    ];
    match extra {
        None => client.query_opt(statement, &params).await,
        Some(extra) => {
            let params: Vec<_> = params.into_iter().chain([extra]).collect();
            client.query_opt(statement, &params).await
        }
    }
}

/// [`place_with`](super::place_with) on a tokio-postgres client outside any
/// transaction, `statement` being its preparation of
/// [`PLACE_ORDER_SQL`](super::place::PLACE_ORDER_SQL). `None` when the
/// idempotency key was taken: nothing was written, and `place_with` on the
/// pool tells the earlier order from a conflict (it writes nothing either).
pub(crate) async fn place_order_on(
    client: &tokio_postgres::Client,
    statement: &tokio_postgres::Statement,
    enqueuer: &Enqueuer,
    placing: &Placing<'_>,
) -> Result<Option<Placed>, tokio_postgres::Error> {
    let span = tracing::info_span!("place_order", order_id = tracing::field::Empty);
    let own = span.in_scope(|| enqueuer.own_insert_alone());
    let row = insert_placed_on(client, statement, placing, &own, None)
        .instrument(span.clone())
        .await?;
    let row = row.as_ref().map(PlacedRow::from_row).transpose()?.flatten();
    Ok(row.map(|row| placed(placing, row, own, &span)))
}

/// [`place_order_on`] with `statement` the preparation of
/// [`PLACE_ORDER_AS_KEY_SQL`]: placing's key (`cause.api_key_id`) must still
/// hold one of `granting`, and be neither revoked nor expired.
pub(crate) async fn place_order_as_key_on(
    client: &tokio_postgres::Client,
    statement: &tokio_postgres::Statement,
    enqueuer: &Enqueuer,
    placing: &Placing<'_>,
    granting: &[&str],
) -> Result<KeyChecked, tokio_postgres::Error> {
    let span = tracing::info_span!("place_order", order_id = tracing::field::Empty);
    let own = span.in_scope(|| enqueuer.own_insert_alone());
    let row = insert_placed_on(client, statement, placing, &own, Some(&granting))
        .instrument(span.clone())
        .await?;
    let Some(row) = row else {
        return Ok(KeyChecked::Refused);
    };
    let placed_row = PlacedRow::from_row(&row)?;
    Ok(KeyChecked::Placed(
        placed_row.map(|row| placed(placing, row, own, &span)),
    ))
}
