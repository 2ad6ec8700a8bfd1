//! `order_fanout`: the deliveries of an event with more subscribers than its
//! own transaction writes (`FANOUT_INLINE`), written after that transaction
//! committed, a batch per transaction, each exactly once.
//!
//! The job names its endpoints as the event's transaction read them, so an
//! endpoint added after the event gets none of it and one disabled or
//! removed meanwhile still gets its delivery job, which then finds it as any
//! queued delivery would. The event's `fanned_out` counts the deliveries
//! written so far: each batch locks the event row, writes the next endpoints'
//! jobs and moves the count in one transaction. A fan-out that dies halfway
//! is claimed again and carries on from the count; one still running beside
//! it (a relay that lost its lease but not its thread) waits on the row lock
//! and then finds those endpoints written. So each (event, endpoint) pair
//! gets one job, keyed by its place in the job's list.

use diesel::prelude::*;

use super::events::{KeyAge, Subscribers};
use super::jobs::OrderFanout;
use crate::outbox::Enqueuer;
use crate::schema::order_events;

/// Deliveries written per transaction: large enough that a thousand
/// endpoints take a few commits, small enough that no transaction holds many
/// ordering keys' locks for long.
pub const FANOUT_BATCH: usize = 500;

/// What [`expand_fanout`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FanoutProgress {
    /// Delivery jobs this call wrote.
    pub written: usize,
    /// Deliveries the event has in all.
    pub total: usize,
}

/// Writes the deliveries of `fanout` not yet written, `batch` per
/// transaction, with `enqueuer` (which wakes the relays for each).
pub fn expand_fanout(
    conn: &mut PgConnection,
    enqueuer: &Enqueuer,
    fanout: &OrderFanout,
    batch: usize,
) -> QueryResult<FanoutProgress> {
    let mut written = 0;
    loop {
        match expand_fanout_step(conn, enqueuer, fanout, batch)? {
            0 => {
                return Ok(FanoutProgress {
                    written,
                    total: fanout.webhook_endpoints.len() + fanout.nats_endpoints.len(),
                });
            }
            step => written += step,
        }
    }
}

/// One transaction of [`expand_fanout`]: the next `batch` deliveries not yet
/// written, and the event's count moved past them. Returns how many it
/// wrote; 0 once every delivery is written.
pub fn expand_fanout_step(
    conn: &mut PgConnection,
    enqueuer: &Enqueuer,
    fanout: &OrderFanout,
    batch: usize,
) -> QueryResult<usize> {
    let webhooks = fanout.webhook_endpoints.len();
    let total = webhooks + fanout.nats_endpoints.len();
    enqueuer.transaction(conn, |conn| {
        // NO KEY UPDATE: serialises the event's fan-outs without blocking
        // the key-share locks of rows that reference the event.
        let done: i32 = order_events::table
            .find(fanout.event_id)
            .select(order_events::fanned_out)
            .for_no_key_update()
            .first(conn)?;
        let from = usize::try_from(done).unwrap_or(0).min(total);
        if from == total {
            return Ok(0);
        }
        let to = (from + batch.max(1)).min(total);
        let slice = Subscribers {
            event_id: fanout.event_id,
            webhook_endpoints: &fanout.webhook_endpoints[from.min(webhooks)..to.min(webhooks)],
            nats_endpoints: &fanout.nats_endpoints
                [from.saturating_sub(webhooks)..to.saturating_sub(webhooks)],
            default_behind_unaddressed: fanout.default_behind_unaddressed,
        };
        let jobs = slice.deliveries(fanout.order_id, fanout.max_attempts, KeyAge::Used)?;
        enqueuer.enqueue_many(conn, &jobs)?;
        let count = i32::try_from(to)
            .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?;
        diesel::update(order_events::table.find(fanout.event_id))
            .set(order_events::fanned_out.eq(count))
            .execute(conn)?;
        Ok(to - from)
    })
}
