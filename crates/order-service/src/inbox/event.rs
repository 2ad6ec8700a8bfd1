//! What a provider's event means for an order, read from its JSON alone:
//! a payment, a refund, or nothing this shop acts on. A verified message is
//! read once ([`Message::read`]), before it takes a database connection; the
//! decision against the order's row is [`super::apply`]'s.
//!
//! - stripe `payment_intent.succeeded`: the order in
//!   `data.object.metadata.order_id`, the amount `amount_received`, the
//!   reference the intent's `id`;
//! - stripe `checkout.session.completed` (paid): `client_reference_id` or
//!   `metadata.order_id`, `amount_total`, reference `payment_intent`;
//! - stripe `charge.refunded`: `metadata.order_id`, `amount_refunded`,
//!   reference `payment_intent`;
//! - standard `payment.succeeded` / `payment.refunded`: `data.order_id`,
//!   `amount_cents`, `currency`, `reference`.

use serde_json::Value;

use super::Via;
use super::source::{SourceKind, SourceMode};
use crate::orders::DisplayText;

/// What the message asks of its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent {
    Pay,
    Refund,
}

/// The order a message names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderRef {
    Id(i64),
    /// Present, but no order id this shop could have made.
    NotANumber(String),
}

/// A payment or refund, as the provider describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payment {
    pub intent: Intent,
    pub order: OrderRef,
    /// In the currency's minor unit, as the provider sends it.
    pub amount_cents: Option<i64>,
    /// Upper case (Stripe sends `usd`).
    pub currency: Option<String>,
    /// The provider's id of the payment: the same for both events of one
    /// Checkout payment, so the second is known as already applied.
    pub reference: Option<String>,
}

/// What a message means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Meaning {
    Payment(Payment),
    /// Nothing to do; the reason is stored with the message.
    Ignored(String),
}

/// A verified message, read: what the inbox records of it and what it asks
/// of an order.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The source's name.
    pub source: String,
    /// Stripe's event id, or Standard Webhooks' `webhook-id`.
    pub message_id: String,
    /// A webhook, or an event the provider's log listed.
    pub via: Via,
    pub payload: Value,
    pub meaning: Meaning,
    /// A payment's [`Reference`]; `None` when it asks nothing.
    pub reference: Option<Reference>,
}

impl Message {
    /// Reads `payload` (already verified) as an event of a `kind` source
    /// that takes `mode` events.
    pub fn read(
        source: &str,
        kind: SourceKind,
        mode: SourceMode,
        message_id: String,
        payload: Value,
        via: Via,
    ) -> Message {
        let meaning = match other_mode(kind, mode, &payload) {
            Some(reason) => Meaning::Ignored(reason),
            None => interpret(kind, &payload),
        };
        let reference = match &meaning {
            Meaning::Payment(payment) => Some(Reference::of(payment, &message_id)),
            Meaning::Ignored(_) => None,
        };
        Message {
            source: source.to_owned(),
            message_id,
            via,
            payload,
            meaning,
            reference,
        }
    }
}

/// What an order's payment is known by: the provider's reference of the
/// payment, or the message's own id when it names none, on one line.
#[derive(Debug, Clone, PartialEq)]
pub struct Reference {
    /// Compared with the references of the order's events.
    pub key: String,
    /// Stored in the order's event (`payment_reference`): the key, or
    /// "(no reference)" for one that is no displayable text.
    pub shown: DisplayText,
}

impl Reference {
    pub fn of(payment: &Payment, message_id: &str) -> Reference {
        let key = crate::text::one_line(payment.reference.as_deref().unwrap_or(message_id), 200);
        let shown = DisplayText::parse(&key, 200)
            .or_else(|_| DisplayText::parse("(no reference)", 200))
            .unwrap_or_else(|_| unreachable!("a fixed, valid text"));
        Reference { key, shown }
    }
}

/// The event's type, as the provider names it (`type` at the top).
pub fn event_type(payload: &Value) -> Option<&str> {
    payload.get("type").and_then(Value::as_str)
}

/// Why a Stripe event is not for a source of `mode`, if it is not: its
/// `livemode` names the other mode. An event without `livemode` (or a
/// `standard` source's) is for every mode.
pub fn other_mode(kind: SourceKind, mode: SourceMode, payload: &Value) -> Option<String> {
    if kind != SourceKind::Stripe {
        return None;
    }
    let livemode = payload.get("livemode").and_then(Value::as_bool)?;
    if mode.takes(livemode) {
        return None;
    }
    Some(format!(
        "a {} event (livemode {livemode}) at a source that takes {} events only",
        if livemode { "live-mode" } else { "test-mode" },
        mode
    ))
}

/// Reads `payload` (already verified) as a `kind` source's event.
pub fn interpret(kind: SourceKind, payload: &Value) -> Meaning {
    let Some(event_type) = event_type(payload) else {
        return Meaning::Ignored("the event has no \"type\"".into());
    };
    match (kind, event_type) {
        (SourceKind::Stripe, "payment_intent.succeeded") => {
            let object = &payload["data"]["object"];
            payment(
                Intent::Pay,
                &object["metadata"]["order_id"],
                "data.object.metadata.order_id",
                object,
                "amount_received",
                "id",
            )
        }
        (SourceKind::Stripe, "checkout.session.completed") => {
            let object = &payload["data"]["object"];
            // A delayed payment method completes the session unpaid; its
            // money arrives later as the intent's own event.
            if let Some(status) = object.get("payment_status").and_then(Value::as_str)
                && status != "paid"
            {
                return Meaning::Ignored(format!(
                    "checkout session not paid yet (payment_status {:?})",
                    crate::text::one_line(status, 40)
                ));
            }
            let order = match &object["client_reference_id"] {
                Value::Null => &object["metadata"]["order_id"],
                given => given,
            };
            payment(
                Intent::Pay,
                order,
                "data.object.client_reference_id or metadata.order_id",
                object,
                "amount_total",
                "payment_intent",
            )
        }
        (SourceKind::Stripe, "charge.refunded") => {
            let object = &payload["data"]["object"];
            payment(
                Intent::Refund,
                &object["metadata"]["order_id"],
                "data.object.metadata.order_id",
                object,
                "amount_refunded",
                "payment_intent",
            )
        }
        (SourceKind::Standard, "payment.succeeded" | "payment.refunded") => {
            let data = &payload["data"];
            let intent = if event_type == "payment.succeeded" {
                Intent::Pay
            } else {
                Intent::Refund
            };
            payment(
                intent,
                &data["order_id"],
                "data.order_id",
                data,
                "amount_cents",
                "reference",
            )
        }
        (_, other) => Meaning::Ignored(format!(
            "{} is not an event this shop acts on",
            crate::text::one_line(other, 80)
        )),
    }
}

fn payment(
    intent: Intent,
    order: &Value,
    order_path: &str,
    object: &Value,
    amount_field: &str,
    reference_field: &str,
) -> Meaning {
    let order = match order {
        Value::Null => {
            return Meaning::Ignored(format!("no order id in {order_path}"));
        }
        Value::Number(n) => match n.as_i64() {
            Some(id) => OrderRef::Id(id),
            None => OrderRef::NotANumber(n.to_string()),
        },
        Value::String(s) => match s.trim().parse::<i64>() {
            Ok(id) => OrderRef::Id(id),
            Err(_) => OrderRef::NotANumber(s.clone()),
        },
        other => OrderRef::NotANumber(other.to_string()),
    };
    Meaning::Payment(Payment {
        intent,
        order,
        amount_cents: object.get(amount_field).and_then(Value::as_i64),
        currency: object
            .get("currency")
            .and_then(Value::as_str)
            .map(str::to_ascii_uppercase),
        reference: object
            .get(reference_field)
            .and_then(Value::as_str)
            .map(str::to_owned),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn stripe_events_name_their_order_amount_and_reference() {
        let intent = json!({"type": "payment_intent.succeeded", "data": {"object": {
            "id": "pi_1", "amount_received": 1200, "currency": "usd",
            "metadata": {"order_id": "42"}}}});
        assert_eq!(
            interpret(SourceKind::Stripe, &intent),
            Meaning::Payment(Payment {
                intent: Intent::Pay,
                order: OrderRef::Id(42),
                amount_cents: Some(1200),
                currency: Some("USD".into()),
                reference: Some("pi_1".into()),
            })
        );
        let session = json!({"type": "checkout.session.completed", "data": {"object": {
            "id": "cs_1", "client_reference_id": "42", "amount_total": 1200,
            "currency": "usd", "payment_intent": "pi_1", "payment_status": "paid"}}});
        let Meaning::Payment(p) = interpret(SourceKind::Stripe, &session) else {
            panic!("a payment");
        };
        assert_eq!(p.reference.as_deref(), Some("pi_1"));
        let missing =
            json!({"type": "payment_intent.succeeded", "data": {"object": {"id": "pi_2"}}});
        assert!(matches!(
            interpret(SourceKind::Stripe, &missing),
            Meaning::Ignored(_)
        ));
        let word = json!({"type": "charge.refunded", "data": {"object": {"metadata": {"order_id": "abc"}}}});
        let Meaning::Payment(p) = interpret(SourceKind::Stripe, &word) else {
            panic!("a refund");
        };
        assert_eq!(p.order, OrderRef::NotANumber("abc".into()));
        assert!(matches!(
            interpret(SourceKind::Stripe, &json!({"type": "customer.created"})),
            Meaning::Ignored(_)
        ));
    }

    #[test]
    fn only_a_stripe_event_marked_with_the_other_mode_is_for_another_source() {
        let test = json!({"type": "payment_intent.succeeded", "livemode": false});
        let live = json!({"type": "payment_intent.succeeded", "livemode": true});
        let unmarked = json!({"type": "payment_intent.succeeded"});
        let stripe = SourceKind::Stripe;
        let reason = other_mode(stripe, SourceMode::Live, &test).expect("refused");
        assert!(reason.contains("livemode false"), "{reason}");
        assert!(other_mode(stripe, SourceMode::Test, &live).is_some());
        assert_eq!(other_mode(stripe, SourceMode::Live, &live), None);
        assert_eq!(other_mode(stripe, SourceMode::Any, &test), None);
        assert_eq!(other_mode(stripe, SourceMode::Live, &unmarked), None);
        assert_eq!(
            other_mode(SourceKind::Standard, SourceMode::Live, &test),
            None
        );
    }
}
