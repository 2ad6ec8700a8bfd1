//! Receiving one verified message: claim it with the core's inbox, decide
//! what it does to its order, do it, and record it, all in one transaction.
//! An operator's decision on a held message is in [`super::held`].
//!
//! The claim ([`claim_message`]) holds the message's turn until the
//! transaction ends, so a copy received meanwhile waits and then answers
//! [`Answer::Repeat`]; the message's row is inserted once, complete, after
//! the decision, with the id the claim drew, and commits with the effect.
//!
//! The order row is locked once ([`LockedOrder`]) and the decision reads
//! that row, then hands it to the transition, so a payment racing a cancel
//! is decided against whichever committed first: paid then cancelled, or
//! cancelled and then held as "refund needed", never both applied. A payment
//! racing the expiry sweep is decided the same way: paid, or held as "paid
//! after the order expired".

use diesel::prelude::*;
use outbox_core::dedupe::{Claim, claim_message};
use serde_json::Value;

use super::MessageStatus;
use super::event::{Intent, Meaning, Message, OrderRef, Payment, event_type};
use crate::orders::{
    Cause, EventJobs, LockedOrder, OrderStatus, Transition, TransitionError, transition_locked,
};
use crate::outbox::Enqueuer;
use crate::schema::{inbox_messages, order_events};

/// What receiving a message did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Recorded now, with what it did.
    Recorded {
        id: i64,
        status: MessageStatus,
        order_id: Option<i64>,
        reason: Option<String>,
    },
    /// Recorded before: nothing changed. The first copy's status.
    Repeat {
        id: i64,
        status: Option<MessageStatus>,
    },
}

impl Answer {
    /// The `status` of the `200` answer: the message's, `"repeat"` for a copy.
    pub fn status_word(&self) -> &'static str {
        match self {
            Answer::Recorded { status, .. } => status.as_str(),
            Answer::Repeat { .. } => "repeat",
        }
    }
}

/// What a message does to its order, decided against the locked row.
#[derive(Debug)]
enum Decision {
    Apply {
        order: LockedOrder,
        transition: Transition,
    },
    Keep {
        order_id: Option<i64>,
        status: MessageStatus,
        reason: String,
    },
}

/// Applies `message` and records it, in one transaction (the caller's, if
/// one is open). A message id seen before answers [`Answer::Repeat`] and
/// changes nothing; a copy being applied concurrently by another receiver
/// makes this call wait for it, then answer `Repeat`.
pub fn receive(
    conn: &mut PgConnection,
    enqueuer: &Enqueuer,
    message: &Message,
    jobs: impl Into<EventJobs>,
) -> QueryResult<Answer> {
    let jobs = jobs.into();
    let answer = enqueuer.transaction(conn, |conn| {
        let id = match claim_message(conn, &message.source, &message.message_id)? {
            Claim::New { id } => id,
            Claim::Repeat { id } => return repeat_of(conn, id),
        };
        let decision = decide(conn, message)?;
        let (status, order_id, reason) = carry_out(conn, enqueuer, decision, id, jobs)?;
        diesel::insert_into(inbox_messages::table)
            .values((
                inbox_messages::id.eq(id),
                inbox_messages::source.eq(&message.source),
                inbox_messages::message_id.eq(&message.message_id),
                inbox_messages::message_type
                    .eq(event_type(&message.payload).map(|t| crate::text::one_line(t, 200))),
                inbox_messages::order_id.eq(order_id),
                inbox_messages::status.eq(status.as_str()),
                inbox_messages::reason.eq(&reason),
                inbox_messages::payload.eq(&message.payload),
                inbox_messages::via.eq(message.via.as_str()),
                inbox_messages::decided_at
                    .eq((status != MessageStatus::Held).then(chrono::Utc::now)),
            ))
            .execute(conn)?;
        Ok(Answer::Recorded {
            id,
            status,
            order_id,
            reason,
        })
    })?;
    observe(message, &answer);
    Ok(answer)
}

/// The metric by source and status, and a WARN line for each held message:
/// an operator has something to decide.
fn observe(message: &Message, answer: &Answer) {
    metrics::counter!(
        "outbox_inbox_messages_total",
        "source" => message.source.clone(),
        "status" => answer.status_word(),
    )
    .increment(1);
    if let Answer::Recorded {
        id,
        status: MessageStatus::Held,
        order_id,
        reason,
    } = answer
    {
        tracing::warn!(
            inbox_message_id = id,
            source = message.source,
            message_id = message.message_id,
            order_id,
            reason = reason.as_deref().unwrap_or(""),
            "inbox message held: an operator decides (outbox-relay inbox apply|dismiss {id})"
        );
    }
}

fn repeat_of(conn: &mut PgConnection, id: i64) -> QueryResult<Answer> {
    let status: Option<String> = inbox_messages::table
        .find(id)
        .select(inbox_messages::status)
        .first(conn)?;
    Ok(Answer::Repeat {
        id,
        status: status.and_then(|s| s.parse().ok()),
    })
}

/// The `payment_reference` of the order's latest event of `event_type`:
/// what paid it, or what refunded it.
fn reference_of(
    conn: &mut PgConnection,
    order_id: i64,
    event_type: &str,
) -> QueryResult<Option<Option<String>>> {
    let data: Option<Value> = order_events::table
        .filter(order_events::order_id.eq(order_id))
        .filter(order_events::event_type.eq(event_type))
        .order(order_events::seq.desc())
        .select(order_events::data)
        .first(conn)
        .optional()?;
    Ok(data.map(|d| {
        d.get("payment_reference")
            .and_then(Value::as_str)
            .map(str::to_owned)
    }))
}

fn keep(order_id: Option<i64>, status: MessageStatus, reason: String) -> Decision {
    Decision::Keep {
        order_id,
        status,
        reason,
    }
}

fn decide(conn: &mut PgConnection, message: &Message) -> QueryResult<Decision> {
    let payment = match &message.meaning {
        Meaning::Ignored(reason) => return Ok(keep(None, MessageStatus::Ignored, reason.clone())),
        Meaning::Payment(payment) => payment,
    };
    let order_id = match &payment.order {
        OrderRef::Id(id) => *id,
        OrderRef::NotANumber(raw) => {
            return Ok(keep(
                None,
                MessageStatus::Unmatched,
                format!(
                    "order id {:?} is not a number",
                    crate::text::one_line(raw, 60)
                ),
            ));
        }
    };
    let Some(order) = LockedOrder::lock(conn, order_id)? else {
        return Ok(keep(
            None,
            MessageStatus::Unmatched,
            format!("there is no order {order_id}"),
        ));
    };
    // Message::read gives every payment its reference; one built otherwise
    // is for an operator to look at.
    let Some(reference) = &message.reference else {
        return Ok(keep(
            Some(order_id),
            MessageStatus::Held,
            "a payment read without its reference".to_owned(),
        ));
    };
    let (shown, reference) = (reference.shown.clone(), &reference.key);
    let held = |reason: String| Ok(keep(Some(order_id), MessageStatus::Held, reason));
    let ignored = |reason: String| Ok(keep(Some(order_id), MessageStatus::Ignored, reason));
    match payment.intent {
        Intent::Pay => {
            let paid_by = reference_of(conn, order_id, OrderStatus::Paid.event_type())?;
            if let Some(paid_by) = &paid_by
                && paid_by.as_deref() == Some(reference.as_str())
            {
                // Checkout's two events of one payment, or a resend under a new event id.
                return ignored(format!("order {order_id} is already paid by {reference}"));
            }
            if order.status() == OrderStatus::Cancelled {
                return held(format!(
                    "refund needed: order {order_id} was cancelled before this payment ({reference}) arrived"
                ));
            }
            if order.status() == OrderStatus::Expired {
                return held(format!(
                    "paid after the order expired: refund needed: order {order_id} expired before this payment ({reference}) arrived"
                ));
            }
            if let Some(reason) = money_differs(payment, &order) {
                return held(reason);
            }
            if let Some(paid_by) = paid_by {
                return held(format!(
                    "paid again under another reference: order {order_id} was paid by {}, this is {reference}",
                    paid_by.as_deref().unwrap_or("an unknown reference")
                ));
            }
            if order.status() != OrderStatus::Placed {
                return held(format!(
                    "order {order_id} is {} and cannot become paid",
                    order.status()
                ));
            }
            Ok(Decision::Apply {
                order,
                transition: Transition::Pay {
                    payment_reference: shown,
                },
            })
        }
        Intent::Refund => {
            let Some(paid_by) = reference_of(conn, order_id, OrderStatus::Paid.event_type())?
            else {
                return held(format!(
                    "refund of an order not paid: order {order_id} is {}",
                    order.status()
                ));
            };
            // A refund returns one payment. A second payment held as "paid
            // again" is refunded at the provider too, and that refund names
            // the same order and amount: only its reference tells it apart.
            if paid_by.as_deref() != Some(reference.as_str()) {
                return held(format!(
                    "refund of another payment: order {order_id} was paid by {}, this refunds {reference}",
                    paid_by.as_deref().unwrap_or("an unknown reference")
                ));
            }
            if let Some(refunded_by) =
                reference_of(conn, order_id, OrderStatus::Refunded.event_type())?
            {
                return ignored(format!(
                    "order {order_id} is already refunded{}",
                    refunded_by.map(|r| format!(" ({r})")).unwrap_or_default()
                ));
            }
            if order.status() == OrderStatus::Cancelled {
                return ignored(format!(
                    "order {order_id} was cancelled after payment; this refund returns that payment"
                ));
            }
            if !order.status().can_become(OrderStatus::Refunded) {
                return held(format!(
                    "order {order_id} is {} and cannot become refunded",
                    order.status()
                ));
            }
            if let Some(reason) = money_differs(payment, &order) {
                return held(reason);
            }
            Ok(Decision::Apply {
                order,
                transition: Transition::Refund {
                    reason: None,
                    payment_reference: Some(shown),
                },
            })
        }
    }
}

/// Why the message's money is not the order's, if it is not.
fn money_differs(payment: &Payment, order: &LockedOrder) -> Option<String> {
    let amount = payment.amount_cents;
    let currency = payment.currency.as_deref();
    if amount == Some(order.total_cents()) && currency == Some(order.currency()) {
        return None;
    }
    // As people read money (`19.00 EUR`), where the currency is one we know;
    // otherwise the minor units the provider sent, named as such.
    let shown = |amount: Option<i64>, currency: Option<&str>| match (amount, currency) {
        (Some(minor), Some(code)) => match crate::orders::Currency::parse(code) {
            Some(known) => known.format(minor),
            None => format!("{minor} (minor units) {code}"),
        },
        (amount, currency) => format!(
            "{} {}",
            amount.map_or_else(|| "no amount".to_owned(), |a| format!("{a} (minor units)")),
            currency.unwrap_or("(no currency)")
        ),
    };
    Some(format!(
        "amount or currency differs: the message says {}, the order is {}",
        shown(amount, currency),
        shown(Some(order.total_cents()), Some(order.currency()))
    ))
}

/// Applies a decision; returns what to store on the message.
fn carry_out(
    conn: &mut PgConnection,
    enqueuer: &Enqueuer,
    decision: Decision,
    message_id: i64,
    jobs: EventJobs,
) -> QueryResult<(MessageStatus, Option<i64>, Option<String>)> {
    match decision {
        Decision::Keep {
            order_id,
            status,
            reason,
        } => Ok((status, order_id, Some(reason))),
        Decision::Apply { order, transition } => {
            let order_id = order.id();
            let cause = Cause::inbox_message(message_id);
            match transition_locked(conn, enqueuer, order, &transition, cause, jobs) {
                Ok(_) => Ok((MessageStatus::Applied, Some(order_id), None)),
                // The decision read the row it holds: only a database error is left.
                Err(TransitionError::Database(e)) => Err(e),
                Err(other) => Ok((MessageStatus::Held, Some(order_id), Some(other.to_string()))),
            }
        }
    }
}
