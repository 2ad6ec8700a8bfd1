//! Order transitions: pay, ship, deliver, cancel, refund, and the system's
//! expire ([`super::expiry`]). Each is one transaction: a
//! guarded status update that locks the order row, the event with the next
//! `seq`, and the jobs the event needs (a delivery to every subscribed endpoint, an email for
//! shipped, cancelled, refunded and expired), queued behind the order's earlier jobs of
//! the same kind by their ordering key. Leaving `placed` clears `expires_at`.
//!
//! A caller that decides on the order's row before moving it (the inbox: a
//! payment against what the order is now) locks it once
//! ([`super::lock::LockedOrder`]) and hands it to [`transition_locked`] in
//! the same transaction. The requests' bodies are parsed in
//! [`super::transition_body`].

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::domain::DisplayText;
use super::events::{EventJobs, NextEvent, record_and_enqueue};
use super::idempotency::{Cause, IdempotencyKey};
use super::lock::LockedOrder;
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

impl Transition {
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
    let jobs = jobs.into();
    let key = cause.scope(key);
    let key = key.as_ref();
    let fingerprint = key.map(|_| fingerprint(order_id, transition));
    enqueuer.transaction(conn, |conn| {
        let Some(order) = LockedOrder::lock(conn, order_id)? else {
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
        let key = key.zip(fingerprint.as_deref());
        move_locked(conn, enqueuer, order, transition, key, cause, jobs)
    })
}

/// Moves `order`, locked by the caller in its open transaction, by
/// `transition` on behalf of `cause`: the transition's guard, the status,
/// the event and its jobs, committed with whatever the caller wrote.
pub fn transition_locked(
    conn: &mut PgConnection,
    enqueuer: &Enqueuer,
    order: LockedOrder,
    transition: &Transition,
    cause: Cause,
    jobs: impl Into<EventJobs>,
) -> Result<TransitionOutcome, TransitionError> {
    move_locked(conn, enqueuer, order, transition, None, cause, jobs.into())
}

fn move_locked(
    conn: &mut PgConnection,
    enqueuer: &Enqueuer,
    order: LockedOrder,
    transition: &Transition,
    key: Option<(&IdempotencyKey, &str)>,
    cause: Cause,
    event_jobs: EventJobs,
) -> Result<TransitionOutcome, TransitionError> {
    let requested = transition.target();
    if !order.status().can_become(requested) {
        return Err(TransitionError::Invalid {
            order_id: order.id(),
            current: order.status(),
            requested,
        });
    }
    let id = OrderId::new(order.id());
    // `expires_at` lives only while the order is placed, and no
    // transition leads to `placed`.
    diesel::update(orders::table.find(order.id()))
        .set((
            orders::status.eq(requested.as_str()),
            orders::expires_at.eq(None::<DateTime<Utc>>),
        ))
        .execute(conn)?;
    let event = NextEvent {
        event_type: requested.event_type(),
        data: transition.data(),
        key,
        cause,
        email: transition.emails(),
    };
    let event_id = record_and_enqueue(conn, enqueuer, id, event, event_jobs)?;
    Ok(TransitionOutcome::Applied { event_id })
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
}
