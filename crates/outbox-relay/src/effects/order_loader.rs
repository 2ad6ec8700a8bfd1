//! How an order job's worker reads the order it names, and the span it runs in.

use outbox_core::worker::EffectError;

use crate::db::{PgPool, run_blocking};
use crate::orders::{Order, OrderEvent, OrderId, load_event, load_order};

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

    pub(crate) async fn event(
        &self,
        event_id: Option<i64>,
    ) -> Result<Option<OrderEvent>, EffectError> {
        let Some(event_id) = event_id else {
            return Ok(None);
        };
        run_blocking(&self.pool, move |conn| Ok(load_event(conn, event_id)?))
            .await
            .map_err(|e| EffectError::retryable(format!("loading event {event_id}: {e}")))?
            .map(Some)
            .ok_or_else(|| EffectError::permanent(format!("event {event_id} no longer exists")))
    }
}
