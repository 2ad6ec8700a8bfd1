//! How an order job's worker reads the order it names, and the span it runs in.

use outbox_core::worker::EffectError;

use crate::db::{PgPool, run_blocking};
use crate::orders::{EventId, Order, OrderEvent, OrderId, load_event, load_order};

/// An order's stored receipt as an email may carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StoredReceipt {
    /// The PDF, no larger than the bound asked for.
    Pdf(Vec<u8>),
    /// A PDF of this many bytes, over the bound: left in the database.
    TooLarge(i64),
    /// No `receipts` row: the receipt job failed, or has not run.
    Missing,
}

/// The span an order job's worker runs in, inside the relay's `job` span, so
/// that its log lines name the order.
pub(crate) fn order_span(order_id: OrderId) -> tracing::Span {
    tracing::info_span!("order_job", order_id = order_id.get())
}

/// Reads what an order job names, with the error classes a worker needs: a
/// database that does not answer is worth a retry; a row that is gone, or
/// holds what its type refuses (a currency code no longer known), is not.
#[derive(Debug, Clone)]
pub(crate) struct OrderLoader {
    pub(crate) pool: PgPool,
}

impl OrderLoader {
    pub(crate) async fn order(&self, order_id: OrderId) -> Result<Order, EffectError> {
        run_blocking(&self.pool, move |conn| match load_order(conn, order_id) {
            // Diesel names the field; its source names the value.
            Err(diesel::result::Error::DeserializationError(e)) => {
                Ok(Err(super::error_chain(e.as_ref())))
            }
            loaded => Ok(Ok(loaded?)),
        })
        .await
        .map_err(|e| EffectError::retryable(format!("loading order {order_id}: {e}")))?
        .map_err(|e| EffectError::permanent(format!("order {order_id} cannot be read: {e}")))?
        .ok_or_else(|| EffectError::permanent(format!("order {order_id} no longer exists")))
    }

    pub(crate) async fn event(&self, event_id: EventId) -> Result<OrderEvent, EffectError> {
        run_blocking(&self.pool, move |conn| {
            Ok(load_event(conn, event_id.get())?)
        })
        .await
        .map_err(|e| EffectError::retryable(format!("loading event {event_id}: {e}")))?
        .ok_or_else(|| EffectError::permanent(format!("event {event_id} no longer exists")))
    }

    /// The order's receipt from `receipts`, its bytes only when they are at
    /// most `max_bytes`: the size is read first, so a PDF too large to mail
    /// never leaves the database.
    pub(crate) async fn receipt(
        &self,
        order_id: OrderId,
        max_bytes: i64,
    ) -> Result<StoredReceipt, EffectError> {
        use diesel::prelude::*;
        use diesel::sql_types::{BigInt, Bytea, Nullable};

        #[derive(QueryableByName)]
        struct Row {
            #[diesel(sql_type = BigInt)]
            size: i64,
            #[diesel(sql_type = Nullable<Bytea>)]
            pdf: Option<Vec<u8>>,
        }
        let row = run_blocking(&self.pool, move |conn| {
            Ok(diesel::sql_query(
                "SELECT octet_length(pdf)::bigint AS size, \
                        CASE WHEN octet_length(pdf) <= $2 THEN pdf END AS pdf \
                 FROM receipts WHERE order_id = $1",
            )
            .bind::<BigInt, _>(order_id)
            .bind::<BigInt, _>(max_bytes)
            .get_result::<Row>(conn)
            .optional()?)
        })
        .await
        .map_err(|e| {
            EffectError::retryable(format!("loading the receipt of order {order_id}: {e}"))
        })?;
        Ok(match row {
            None => StoredReceipt::Missing,
            Some(Row { pdf: Some(pdf), .. }) => StoredReceipt::Pdf(pdf),
            Some(Row { size, pdf: None }) => StoredReceipt::TooLarge(size),
        })
    }
}
