//! `OrderId`: the id of an order, in jobs' arguments and in read models.

use std::fmt;

use diesel::deserialize::{self, FromSql, FromSqlRow};
use diesel::expression::AsExpression;
use diesel::pg::{Pg, PgValue};
use diesel::serialize::{self, Output, ToSql};
use diesel::sql_types::BigInt;
use serde::{Deserialize, Serialize};

/// `orders.id`. In JSON it is the bare number, the form every job payload
/// and API answer holds, so any queued job's `order_id` decodes into it.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    AsExpression,
    FromSqlRow,
)]
#[serde(transparent)]
#[diesel(sql_type = BigInt)]
pub struct OrderId(i64);

impl OrderId {
    pub const fn new(id: i64) -> Self {
        OrderId(id)
    }

    pub const fn get(self) -> i64 {
        self.0
    }
}

impl From<i64> for OrderId {
    fn from(id: i64) -> Self {
        OrderId(id)
    }
}

impl From<OrderId> for i64 {
    fn from(id: OrderId) -> Self {
        id.0
    }
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromSql<BigInt, Pg> for OrderId {
    fn from_sql(value: PgValue<'_>) -> deserialize::Result<Self> {
        <i64 as FromSql<BigInt, Pg>>::from_sql(value).map(OrderId)
    }
}

impl ToSql<BigInt, Pg> for OrderId {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> serialize::Result {
        <i64 as ToSql<BigInt, Pg>>::to_sql(&self.0, out)
    }
}
