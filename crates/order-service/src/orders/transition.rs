//! Order transitions: pay, ship, deliver, cancel, refund, and the system's
//! expire ([`super::expiry`]). Each is one transaction: a
//! guarded status update that locks the order row, the event with the next
//! `seq`, and the jobs the event needs (a delivery to every subscribed endpoint, an email for
//! shipped, cancelled, refunded and expired), queued behind the order's earlier jobs of
//! the same kind by their ordering key. Leaving `placed` clears `expires_at`.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use serde::Deserialize;

use super::domain::DisplayText;
use super::events::{EventJobs, KeyAge, event_email, next_seq, record_event};
use super::idempotency::{Cause, IdempotencyKey};
use super::json::{from_json, required};
use super::validation::ValidationError;
use super::{OrderId, OrderStatus};
use crate::outbox::Enqueuer;
use crate::schema::{order_events, orders};

/// What a transition asks for, parsed and validated at the edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    Pay {
        payment_reference: DisplayText,
    },
    Ship {
        carrier: DisplayText,
        tracking_number: DisplayText,
    },
    Deliver,
    Cancel {
        reason: DisplayText,
    },
    /// The money went back: asked for through the API, or told by the
    /// payment provider (an inbox message), whose refund's payment is the
    /// reference.
    Refund {
        reason: Option<DisplayText>,
        payment_reference: Option<DisplayText>,
    },
    /// Not paid by `expires_at`: made by the expiry sweep, never parsed
    /// from a request (it is not in [`Transition::ACTIONS`]).
    Expire {
        expires_at: DateTime<Utc>,
    },
}

const MAX_REFERENCE_CHARS: usize = 200;
const MAX_REASON_CHARS: usize = 500;

/// The bodies of the transitions as they arrive; as strict as an order's.
/// Their schemas (`/openapi.json`) state the rules `Transition::parse` holds them to.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PayBody {
    #[schema(
        required = true,
        nullable = false,
        min_length = 1,
        max_length = 200,
        example = "pi_3Nk"
    )]
    payment_reference: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ShipBody {
    #[schema(
        required = true,
        nullable = false,
        min_length = 1,
        max_length = 200,
        example = "DHL"
    )]
    carrier: Option<String>,
    #[schema(
        required = true,
        nullable = false,
        min_length = 1,
        max_length = 200,
        example = "JD014600006281"
    )]
    tracking_number: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeliverBody {}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CancelBody {
    #[schema(
        required = true,
        nullable = false,
        min_length = 1,
        max_length = 500,
        example = "out of stock"
    )]
    reason: Option<String>,
}

/// Both optional: a refund needs no words, and a shop may not know the
/// provider's reference.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RefundBody {
    #[schema(
        nullable = false,
        min_length = 1,
        max_length = 500,
        example = "returned"
    )]
    reason: Option<String>,
    #[schema(nullable = false, min_length = 1, max_length = 200, example = "pi_3Nk")]
    payment_reference: Option<String>,
}

impl Transition {
    /// The `{action}` of `POST /orders/{id}/{action}`.
    pub const ACTIONS: [&'static str; 5] = ["pay", "ship", "deliver", "cancel", "refund"];

    /// Parses the JSON body of `POST /orders/{id}/{action}`; as strict as an order:
    /// unknown fields are refused, every error names its field.
    pub fn parse(action: &str, body: &Value) -> Result<Transition, ValidationError> {
        let text = |value: Option<String>,
                    name: &str,
                    max: usize|
         -> Result<DisplayText, ValidationError> {
            DisplayText::parse(&required(value, name)?, max)
                .map_err(|m| ValidationError::new(name, m))
        };
        match action {
            "pay" => {
                let body: PayBody = from_json(body)?;
                Ok(Transition::Pay {
                    payment_reference: text(
                        body.payment_reference,
                        "payment_reference",
                        MAX_REFERENCE_CHARS,
                    )?,
                })
            }
            "ship" => {
                let body: ShipBody = from_json(body)?;
                Ok(Transition::Ship {
                    carrier: text(body.carrier, "carrier", MAX_REFERENCE_CHARS)?,
                    tracking_number: text(
                        body.tracking_number,
                        "tracking_number",
                        MAX_REFERENCE_CHARS,
                    )?,
                })
            }
            "deliver" => {
                let DeliverBody {} = from_json(body)?;
                Ok(Transition::Deliver)
            }
            "cancel" => {
                let body: CancelBody = from_json(body)?;
                Ok(Transition::Cancel {
                    reason: text(body.reason, "reason", MAX_REASON_CHARS)?,
                })
            }
            "refund" => {
                let body: RefundBody = from_json(body)?;
                let optional = |value: Option<String>, name: &str, max: usize| {
                    value
                        .map(|v| {
                            DisplayText::parse(&v, max).map_err(|m| ValidationError::new(name, m))
                        })
                        .transpose()
                };
                Ok(Transition::Refund {
                    reason: optional(body.reason, "reason", MAX_REASON_CHARS)?,
                    payment_reference: optional(
                        body.payment_reference,
                        "payment_reference",
                        MAX_REFERENCE_CHARS,
                    )?,
                })
            }
            other => Err(ValidationError::new(
                "",
                format!("{other:?} is not a transition"),
            )),
        }
    }

    /// The status this transition leads to.
    pub fn target(&self) -> OrderStatus {
        match self {
            Transition::Pay { .. } => OrderStatus::Paid,
            Transition::Ship { .. } => OrderStatus::Shipped,
            Transition::Deliver => OrderStatus::Delivered,
            Transition::Cancel { .. } => OrderStatus::Cancelled,
            Transition::Refund { .. } => OrderStatus::Refunded,
            Transition::Expire { .. } => OrderStatus::Expired,
        }
    }

    /// The event's `data`.
    fn data(&self) -> Value {
        match self {
            Transition::Pay { payment_reference } => {
                json!({ "payment_reference": payment_reference.as_str() })
            }
            Transition::Ship {
                carrier,
                tracking_number,
            } => {
                json!({ "carrier": carrier.as_str(), "tracking_number": tracking_number.as_str() })
            }
            Transition::Deliver => json!({}),
            Transition::Cancel { reason } => json!({ "reason": reason.as_str() }),
            Transition::Refund {
                reason,
                payment_reference,
            } => {
                let mut data = serde_json::Map::new();
                if let Some(reason) = reason {
                    data.insert("reason".into(), reason.as_str().into());
                }
                if let Some(reference) = payment_reference {
                    data.insert("payment_reference".into(), reference.as_str().into());
                }
                Value::Object(data)
            }
            Transition::Expire { expires_at } => json!({
                "expires_at": expires_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
            }),
        }
    }

    /// Whether the customer is mailed about it.
    fn emails(&self) -> bool {
        matches!(
            self,
            Transition::Ship { .. }
                | Transition::Cancel { .. }
                | Transition::Refund { .. }
                | Transition::Expire { .. }
        )
    }
}

impl OrderStatus {
    /// placed → paid → shipped → delivered; placed or paid → cancelled;
    /// paid, shipped or delivered → refunded; placed → expired.
    pub fn can_become(self, next: OrderStatus) -> bool {
        use OrderStatus::{Cancelled, Delivered, Expired, Paid, Placed, Refunded, Shipped};
        matches!(
            (self, next),
            (Placed, Paid)
                | (Paid, Shipped)
                | (Shipped, Delivered)
                | (Placed | Paid, Cancelled)
                | (Paid | Shipped | Delivered, Refunded)
                | (Placed, Expired)
        )
    }
}

/// What [`transition_order`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransitionOutcome {
    /// The order moved; this is the new event's id.
    Applied { event_id: i64 },
    /// The Idempotency-Key was used before for this same transition: nothing
    /// was written.
    Repeated { event_id: i64 },
}

#[derive(Debug, thiserror::Error)]
pub enum TransitionError {
    #[error("there is no order {0}")]
    NotFound(i64),
    #[error("order {order_id} is {current}; it cannot become {requested}")]
    Invalid {
        order_id: i64,
        current: OrderStatus,
        requested: OrderStatus,
    },
    #[error("this Idempotency-Key was already used with a different request")]
    IdempotencyConflict,
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

/// Moves order `order_id` by `transition`, in one transaction. With a key, a
/// repeat of the same request returns [`TransitionOutcome::Repeated`].
pub fn transition_order(
    conn: &mut PgConnection,
    enqueuer: &Enqueuer,
    order_id: i64,
    transition: &Transition,
    key: Option<&IdempotencyKey>,
    jobs: impl Into<EventJobs>,
) -> Result<TransitionOutcome, TransitionError> {
    transition_order_by(
        conn,
        enqueuer,
        order_id,
        transition,
        key,
        jobs,
        Cause::of_key(key),
    )
}

/// [`transition_order`] caused by inbox message `inbox_message_id` (a
/// provider's payment or refund), recorded on the event. Called inside the
/// transaction that recorded the message, so both commit together.
pub fn transition_order_for_message(
    conn: &mut PgConnection,
    enqueuer: &Enqueuer,
    order_id: i64,
    transition: &Transition,
    inbox_message_id: i64,
    jobs: impl Into<EventJobs>,
) -> Result<TransitionOutcome, TransitionError> {
    transition_order_by(
        conn,
        enqueuer,
        order_id,
        transition,
        None,
        jobs,
        Cause::inbox_message(inbox_message_id),
    )
}

/// [`transition_order`] on behalf of `cause`, recorded on the event; `key`
/// is taken in `cause`'s space.
pub fn transition_order_by(
    conn: &mut PgConnection,
    enqueuer: &Enqueuer,
    order_id: i64,
    transition: &Transition,
    key: Option<&IdempotencyKey>,
    jobs: impl Into<EventJobs>,
    cause: Cause,
) -> Result<TransitionOutcome, TransitionError> {
    let event_jobs = jobs.into();
    let key = cause.scope(key);
    let key = key.as_ref();
    let fingerprint = key.map(|_| fingerprint(order_id, transition));
    let id = OrderId::new(order_id);
    enqueuer.transaction(conn, |conn| {
        // The row lock orders this order's transitions: seq follows commit order.
        // NO KEY UPDATE, not UPDATE: the foreign key checks of rows that point
        // at the order (a receipt a relay stores while finishing a delivery this
        // transaction may queue behind) take KEY SHARE, which UPDATE would
        // block, and the two transactions would deadlock.
        let current: Option<OrderStatus> = orders::table
            .find(order_id)
            .select(orders::status)
            .for_no_key_update()
            .first(conn)
            .optional()?;
        let Some(current) = current else {
            return Err(TransitionError::NotFound(order_id));
        };
        if let Some(key) = key {
            let same_key = order_events::table
                .filter(order_events::idempotency_key.eq(key.as_str()))
                .into_boxed();
            let same_key = match key.api_key_id() {
                Some(id) => same_key.filter(order_events::api_key_id.eq(id)),
                None => same_key.filter(order_events::api_key_id.is_null()),
            };
            let earlier: Option<(i64, i64, Option<String>)> = same_key
                .select((
                    order_events::id,
                    order_events::order_id,
                    order_events::request_hash,
                ))
                .first(conn)
                .optional()?;
            if let Some((event_id, earlier_order, hash)) = earlier {
                return if earlier_order == order_id && hash == fingerprint {
                    Ok(TransitionOutcome::Repeated { event_id })
                } else {
                    Err(TransitionError::IdempotencyConflict)
                };
            }
        }
        let requested = transition.target();
        if !current.can_become(requested) {
            return Err(TransitionError::Invalid {
                order_id,
                current,
                requested,
            });
        }
        // `expires_at` lives only while the order is placed, and no
        // transition leads to `placed`.
        diesel::update(orders::table.find(order_id))
            .set((
                orders::status.eq(requested.as_str()),
                orders::expires_at.eq(None::<DateTime<Utc>>),
            ))
            .execute(conn)?;
        let seq = next_seq(conn, id)?;
        let event = record_event(
            conn,
            id,
            seq,
            requested.event_type(),
            transition.data(),
            key.zip(fingerprint.as_deref()),
            cause,
        )?;
        let event_id = event.event.event_id;
        let mut jobs = event
            .event
            .deliveries(id, event_jobs, KeyAge::Used, event.behind_fanout)?;
        if transition.emails() {
            jobs.push(event_email(
                id,
                event_id,
                event_jobs.max_attempts,
                KeyAge::Used,
            )?);
        }
        enqueuer.enqueue_many(conn, &jobs)?;
        Ok(TransitionOutcome::Applied { event_id })
    })
}

fn fingerprint(order_id: i64, transition: &Transition) -> String {
    let canonical = json!({
        "order_id": order_id,
        "status": transition.target().as_str(),
        "data": transition.data(),
    });
    hex::encode(Sha256::digest(canonical.to_string().as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_documented_transitions_are_allowed() {
        use OrderStatus::*;
        let all = OrderStatus::ALL;
        let allowed: Vec<(OrderStatus, OrderStatus)> = all
            .iter()
            .flat_map(|a| all.iter().map(move |b| (*a, *b)))
            .filter(|(a, b)| a.can_become(*b))
            .collect();
        assert_eq!(
            allowed,
            vec![
                (Placed, Paid),
                (Placed, Cancelled),
                (Placed, Expired),
                (Paid, Shipped),
                (Paid, Cancelled),
                (Paid, Refunded),
                (Shipped, Delivered),
                (Shipped, Refunded),
                (Delivered, Refunded),
            ]
        );
    }

    #[test]
    fn bodies_are_parsed_strictly_with_field_paths() {
        let ship = Transition::parse(
            "ship",
            &json!({"carrier": "DHL", "tracking_number": "JD0001"}),
        );
        assert!(matches!(ship, Ok(Transition::Ship { .. })));
        let missing = Transition::parse("ship", &json!({"carrier": "DHL"})).expect_err("missing");
        assert_eq!(missing.field, "tracking_number");
        let unknown = Transition::parse("deliver", &json!({"when": "now"})).expect_err("unknown");
        assert_eq!(unknown.field, "when");
        let empty = Transition::parse("cancel", &json!({"reason": "  "})).expect_err("empty");
        assert_eq!(empty.field, "reason");
        assert!(Transition::parse("pay", &json!([])).is_err());
    }
}
