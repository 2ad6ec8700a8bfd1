//! The order's status and the event type of each transition.

use std::fmt;
use std::str::FromStr;

use diesel::deserialize::{self, FromSql, FromSqlRow};
use diesel::pg::{Pg, PgValue};
use diesel::sql_types::Text;
use serde::Serialize;

/// `orders.status`; the `orders_status_valid` CHECK constraint holds the same set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, FromSqlRow, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    Placed,
    Paid,
    Shipped,
    Delivered,
    Cancelled,
    Refunded,
    /// Not paid within its payment window (`ORDER_PAYMENT_WINDOW`): the
    /// system's transition, never a key's.
    Expired,
}

impl OrderStatus {
    pub const ALL: [OrderStatus; 7] = [
        OrderStatus::Placed,
        OrderStatus::Paid,
        OrderStatus::Shipped,
        OrderStatus::Delivered,
        OrderStatus::Cancelled,
        OrderStatus::Refunded,
        OrderStatus::Expired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Placed => "placed",
            OrderStatus::Paid => "paid",
            OrderStatus::Shipped => "shipped",
            OrderStatus::Delivered => "delivered",
            OrderStatus::Cancelled => "cancelled",
            OrderStatus::Refunded => "refunded",
            OrderStatus::Expired => "expired",
        }
    }

    /// The `order_events.type` of reaching this status.
    pub fn event_type(self) -> &'static str {
        match self {
            OrderStatus::Placed => "order.placed",
            OrderStatus::Paid => "order.paid",
            OrderStatus::Shipped => "order.shipped",
            OrderStatus::Delivered => "order.delivered",
            OrderStatus::Cancelled => "order.cancelled",
            OrderStatus::Refunded => "order.refunded",
            OrderStatus::Expired => "order.expired",
        }
    }
}

impl FromStr for OrderStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        OrderStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| format!("unknown order status {s:?}"))
    }
}

impl FromSql<Text, Pg> for OrderStatus {
    fn from_sql(value: PgValue<'_>) -> deserialize::Result<Self> {
        let text = <String as FromSql<Text, Pg>>::from_sql(value)?;
        Ok(text.parse()?)
    }
}

impl fmt::Display for OrderStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
