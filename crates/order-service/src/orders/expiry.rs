//! Order expiry: an order placed under a payment window
//! (`ORDER_PAYMENT_WINDOW`) that is still `placed` at its `expires_at`
//! becomes `expired`, with the event `order.expired`, its deliveries and an
//! email, through the same transition as a payment or a cancellation.
//!
//! The relays' periodic sweep ([`ExpireOrders`]) does it: no row or job per
//! order, only the partial index `orders_expiry_due_idx`, which holds the
//! orders awaiting payment under a window. Each order is expired in its own
//! transaction, which locks the row as every transition does and moves it
//! only while it is `placed`: a payment racing the sweep leaves the order
//! either paid or expired, never both, and two sweeps never expire one
//! order twice.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Timestamptz};
use outbox_core::worker::JobArgs;
use serde::{Deserialize, Serialize};

use super::idempotency::Cause;
use super::transition::{Transition, TransitionError, transition_order_by};
use crate::kinds::EffectKind;
use crate::outbox::Enqueuer;

/// How often relays sweep for due orders: an order expires within about
/// this much of its `expires_at`.
pub const EXPIRY_SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Orders one sweep expires at most; a larger backlog (relays that were
/// down) is worked off by the next sweeps, each a few seconds' work at most.
pub const EXPIRY_BATCH: usize = 1000;

/// The name the relays declare the sweep under (`jobs schedules`).
pub const EXPIRY_SWEEP_NAME: &str = "order_expiry";

/// The periodic sweep's job: expire the orders that are due.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpireOrders {
    /// `max_attempts` of the jobs each expiry enqueues (its deliveries and
    /// email): the declaring relay's `JOB_MAX_ATTEMPTS`.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: i32,
    /// The declaring relay's `FANOUT_INLINE`, for the expiries' deliveries.
    #[serde(default = "default_fanout_inline")]
    pub fanout_inline: usize,
    /// Declared by a relay without `ORDER_PAYMENT_WINDOW`: what it expires
    /// is expired late, worth a WARN.
    #[serde(default)]
    pub fallback: bool,
}

fn default_fanout_inline() -> usize {
    super::DEFAULT_FANOUT_INLINE
}

fn default_max_attempts() -> i32 {
    crate::outbox::DEFAULT_MAX_ATTEMPTS
}

impl JobArgs for ExpireOrders {
    const KIND: &'static str = EffectKind::OrderExpiry.as_str();
}

#[derive(QueryableByName)]
struct DueOrder {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Timestamptz)]
    expires_at: DateTime<Utc>,
}

/// Orders whose expiry failed in one sweep before it gives up: past them
/// the cause is likely the database, not the orders.
const MAX_FAILED: usize = 10;

/// What one sweep did.
#[derive(Debug, Default)]
pub struct Sweep {
    /// The orders expired, each committed on its own.
    pub expired: Vec<i64>,
    /// The orders whose expiry failed (rolled back), with why; later sweeps
    /// try them again. Passed over for the rest of this sweep, so one order
    /// that cannot be expired holds up none of the others.
    pub failed: Vec<(i64, TransitionError)>,
}

/// Expires the due orders, oldest `expires_at` first, each in its own
/// transaction, until none is due or `limit` were tried. Orders another
/// transaction holds (a payment in flight, another relay's sweep) are left
/// to it. An error before any order was picked (the database is away) ends
/// the sweep as an error.
pub fn expire_due_orders(
    conn: &mut PgConnection,
    enqueuer: &Enqueuer,
    jobs: impl Into<super::EventJobs>,
    limit: usize,
) -> Result<Sweep, TransitionError> {
    let jobs = jobs.into();
    let mut sweep = Sweep::default();
    while sweep.expired.len() + sweep.failed.len() < limit && sweep.failed.len() < MAX_FAILED {
        let passed_over: Vec<i64> = sweep.failed.iter().map(|(id, _)| *id).collect();
        let mut picked = None;
        let result = enqueuer.transaction(conn, |conn| {
            let due: Option<DueOrder> = diesel::sql_query(include_str!("sql/next_due_order.sql"))
                .bind::<Array<BigInt>, _>(&passed_over)
                .get_result(conn)
                .optional()?;
            let Some(due) = due else {
                return Ok(None);
            };
            picked = Some(due.id);
            // The row stays locked: the transition's own lock and status
            // check find it placed, as this statement left it.
            let expire = Transition::Expire {
                expires_at: due.expires_at,
            };
            transition_order_by(
                conn,
                enqueuer,
                due.id,
                &expire,
                None,
                jobs,
                Cause::default(),
            )?;
            Ok(Some(due.id))
        });
        match (result, picked) {
            (Ok(Some(order_id)), _) => sweep.expired.push(order_id),
            (Ok(None), _) => break,
            (Err(error), Some(order_id)) => sweep.failed.push((order_id, error)),
            (Err(error), None) => return Err(error),
        }
    }
    Ok(sweep)
}
