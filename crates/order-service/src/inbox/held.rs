//! An operator's decision on a held message (`inbox apply`, `inbox dismiss`,
//! the dashboard): the message row locked, the order's transition when it is
//! applied, and an audit line, in the transaction that makes it.

use diesel::prelude::*;
use diesel::sql_types::{Jsonb, Text};
use serde_json::Value;

use super::MessageStatus;
use super::event::{Intent, Meaning, OrderRef, Reference, interpret};
use super::source::SourceKind;
use crate::orders::{Cause, EventJobs, Transition, TransitionError, transition_order_by};
use crate::outbox::Enqueuer;
use crate::schema::inbox_messages;

/// Why an operator's decision was refused.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error("there is no inbox message {0}")]
    NotFound(i64),
    #[error("inbox message {id} is {status}; only a held message can be applied or dismissed")]
    NotHeld { id: i64, status: String },
    #[error("inbox message {0} does not ask anything of an order ({1})")]
    NothingToApply(i64, String),
    #[error("inbox message {id} cannot be applied: {source}")]
    Transition {
        id: i64,
        #[source]
        source: TransitionError,
    },
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

/// The audit log's names for the operator's decisions.
pub const AUDIT_APPLY: &str = "inbox.apply";
pub const AUDIT_DISMISS: &str = "inbox.dismiss";

/// Applies held message `id` despite its reason (the operator checked the
/// amount, or accepts the second payment): its order's transition, event and
/// jobs, the message `applied`, and an audit line naming `actor`, in one
/// transaction. A transition the order cannot take (a cancelled order cannot
/// become paid) is refused and nothing changes.
pub fn apply_held(
    conn: &mut PgConnection,
    enqueuer: &Enqueuer,
    id: i64,
    actor: &str,
    jobs: impl Into<EventJobs>,
) -> Result<i64, DecideError> {
    let jobs = jobs.into();
    enqueuer.transaction(conn, |conn| {
        let held = lock_held(conn, id)?;
        let (payload, order_id) = (held.payload, held.order_id);
        let payment = match interpret_stored(&payload) {
            Meaning::Payment(payment) => payment,
            Meaning::Ignored(reason) => return Err(DecideError::NothingToApply(id, reason)),
        };
        let order_id = match (order_id, &payment.order) {
            (Some(order_id), _) | (None, &OrderRef::Id(order_id)) => order_id,
            (None, OrderRef::NotANumber(raw)) => {
                return Err(DecideError::NothingToApply(
                    id,
                    format!("order id {raw:?} is not a number"),
                ));
            }
        };
        // A payment naming no reference is known by its message id, as
        // [`super::apply`] knew it: the stored one (a Standard Webhooks
        // message's `webhook-id`), which the payload need not carry.
        let reference = Reference::of(&payment, &held.message_id);
        let transition = match payment.intent {
            Intent::Pay => Transition::Pay {
                payment_reference: reference.shown,
            },
            Intent::Refund => Transition::Refund {
                reason: None,
                payment_reference: Some(reference.shown),
            },
        };
        let cause = Cause::inbox_message(id);
        transition_order_by(conn, enqueuer, order_id, &transition, None, jobs, cause).map_err(
            |source| match source {
                TransitionError::Database(e) => DecideError::Database(e),
                source => DecideError::Transition { id, source },
            },
        )?;
        decide_held(
            conn,
            id,
            MessageStatus::Applied,
            actor,
            AUDIT_APPLY,
            order_id,
        )?;
        Ok(order_id)
    })
}

/// Dismisses held message `id`: nothing happens to its order (the operator
/// refunded at the provider, or found it needs nothing); audited.
pub fn dismiss_held(conn: &mut PgConnection, id: i64, actor: &str) -> Result<(), DecideError> {
    conn.transaction(|conn| {
        let held = lock_held(conn, id)?;
        decide_held(
            conn,
            id,
            MessageStatus::Dismissed,
            actor,
            AUDIT_DISMISS,
            held.order_id.unwrap_or(0),
        )
    })
}

/// A held message's row, locked for the operator's decision.
struct HeldMessage {
    /// The id it was received under: Stripe's event id, or `webhook-id`.
    message_id: String,
    payload: Value,
    order_id: Option<i64>,
}

fn lock_held(conn: &mut PgConnection, id: i64) -> Result<HeldMessage, DecideError> {
    type Row = (Option<String>, String, Option<Value>, Option<i64>);
    let row: Option<Row> = inbox_messages::table
        .find(id)
        .select((
            inbox_messages::status,
            inbox_messages::message_id,
            inbox_messages::payload,
            inbox_messages::order_id,
        ))
        .for_update()
        .first(conn)
        .optional()?;
    let (status, message_id, payload, order_id) = row.ok_or(DecideError::NotFound(id))?;
    if status.as_deref() != Some(MessageStatus::Held.as_str()) {
        return Err(DecideError::NotHeld {
            id,
            status: status.unwrap_or_else(|| "not decided".into()),
        });
    }
    Ok(HeldMessage {
        message_id,
        payload: payload.unwrap_or(Value::Null),
        order_id,
    })
}

fn decide_held(
    conn: &mut PgConnection,
    id: i64,
    status: MessageStatus,
    actor: &str,
    action: &str,
    order_id: i64,
) -> Result<(), DecideError> {
    diesel::update(inbox_messages::table.find(id))
        .set((
            inbox_messages::status.eq(status.as_str()),
            inbox_messages::decided_at.eq(chrono::Utc::now()),
        ))
        .execute(conn)?;
    diesel::sql_query(
        "INSERT INTO admin_audit (actor, action, target, affected) VALUES ($1, $2, $3, 1)",
    )
    .bind::<Text, _>(actor)
    .bind::<Text, _>(action)
    .bind::<Jsonb, _>(serde_json::json!({ "inbox_message_id": id, "order_id": order_id }))
    .execute(conn)?;
    metrics::counter!("outbox_inbox_decisions_total", "decision" => status.as_str()).increment(1);
    Ok(())
}

/// A stored payload read again: its event type says whose it is (Stripe's
/// types and Standard Webhooks' `payment.*` do not overlap), so a message
/// outlives its source's row.
pub(super) fn interpret_stored(payload: &Value) -> Meaning {
    match interpret(SourceKind::Stripe, payload) {
        Meaning::Ignored(_) => interpret(SourceKind::Standard, payload),
        meaning => meaning,
    }
}
