//! An order's row locked for a decision: read once, under the lock its
//! transition needs, so whoever decides on it (a transition's guard, the
//! inbox's payment rules) and the transition that follows see one state.

use diesel::prelude::*;

use super::OrderStatus;
use crate::schema::orders;

/// An order's row, locked (`FOR NO KEY UPDATE`) in the caller's
/// transaction until it ends: what a caller decides on before it moves the
/// order ([`super::transition_locked`]), read once. The row lock orders the order's
/// transitions, so event `seq`s follow commit order, and a transition racing
/// this one (a cancel, the expiry sweep) is decided after it, against what
/// it committed. NO KEY UPDATE, not UPDATE: the foreign key checks of rows
/// that point at the order (a receipt a relay stores while finishing a
/// delivery this transaction may queue behind) take KEY SHARE, which UPDATE
/// would block, and the two transactions would deadlock.
#[derive(Debug)]
pub struct LockedOrder {
    id: i64,
    status: OrderStatus,
    total_cents: i64,
    currency: String,
}

impl LockedOrder {
    /// Locks order `order_id`'s row in the caller's transaction; `None`
    /// when there is no such order.
    pub fn lock(conn: &mut PgConnection, order_id: i64) -> QueryResult<Option<LockedOrder>> {
        let row: Option<(OrderStatus, i64, String)> = orders::table
            .find(order_id)
            .select((orders::status, orders::total_cents, orders::currency))
            .for_no_key_update()
            .first(conn)
            .optional()?;
        Ok(row.map(|(status, total_cents, currency)| LockedOrder {
            id: order_id,
            status,
            total_cents,
            currency: currency.trim().to_owned(),
        }))
    }

    pub fn id(&self) -> i64 {
        self.id
    }

    pub fn status(&self) -> OrderStatus {
        self.status
    }

    pub fn total_cents(&self) -> i64 {
        self.total_cents
    }

    /// The ISO code, upper case.
    pub fn currency(&self) -> &str {
        &self.currency
    }
}
