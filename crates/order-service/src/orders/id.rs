//! The ids that cross module boundaries in jobs' arguments and read models:
//! [`OrderId`], [`EventId`], [`EndpointId`]. Each is its table's `bigint`
//! id, typed so that one cannot be passed where another is meant.

use std::fmt;

use diesel::deserialize::{self, FromSql, FromSqlRow};
use diesel::expression::AsExpression;
use diesel::pg::{Pg, PgValue};
use diesel::serialize::{self, Output, ToSql};
use diesel::sql_types::BigInt;
use serde::{Deserialize, Serialize};

/// A typed `bigint` id: in JSON the bare number (serde transparent), in SQL
/// a `BigInt`, so a job payload or a row holds exactly what an `i64` would.
macro_rules! typed_id {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
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
        pub struct $name(i64);

        impl $name {
            pub const fn new(id: i64) -> Self {
                $name(id)
            }

            pub const fn get(self) -> i64 {
                self.0
            }
        }

        impl From<i64> for $name {
            fn from(id: i64) -> Self {
                $name(id)
            }
        }

        impl From<$name> for i64 {
            fn from(id: $name) -> Self {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl FromSql<BigInt, Pg> for $name {
            fn from_sql(value: PgValue<'_>) -> deserialize::Result<Self> {
                <i64 as FromSql<BigInt, Pg>>::from_sql(value).map($name)
            }
        }

        impl ToSql<BigInt, Pg> for $name {
            fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> serialize::Result {
                <i64 as ToSql<BigInt, Pg>>::to_sql(&self.0, out)
            }
        }
    };
}

typed_id! {
    /// `orders.id`. In JSON it is the bare number, the form every job payload
    /// and API answer holds, so any queued job's `order_id` decodes into it.
    OrderId
}

typed_id! {
    /// `order_events.id`: the event a delivery or an email announces.
    EventId
}

typed_id! {
    /// `endpoints.id`: the subscriber a delivery or a notice goes to.
    EndpointId
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_bare_numbers_in_json() {
        assert_eq!(
            serde_json::to_string(&EndpointId::new(7)).ok().as_deref(),
            Some("7")
        );
        let event: EventId = serde_json::from_str("42").expect("a number");
        assert_eq!(event.get(), 42);
        assert_eq!(OrderId::from(3).to_string(), "3");
    }
}
