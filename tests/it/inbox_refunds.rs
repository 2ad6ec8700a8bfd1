//! Refunds from a provider, bound to the payment they refund; a held
//! payment applied under the id it was received with; Stripe's `livemode`
//! against the source's mode.

use diesel::prelude::*;
use order_service::inbox::source::SourceKind;
use order_service::schema::{inbox_messages, jobs_all, order_events};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::inbox::{
    STANDARD_SECRET, STRIPE_SECRET, TOTAL, add_source, charge_refunded, cli, event_types,
    intent_succeeded, now, order_status, place, post_stripe, stdout_of, stored, stripe,
};
use crate::support::app::{TestApp, spawn_app};

/// The emails of an order: its confirmation, and one per refund applied.
fn emails(app: &TestApp, order: i64) -> i64 {
    jobs_all::table
        .filter(jobs_all::order_id.eq(order))
        .filter(jobs_all::kind.eq_any(["confirmation_email", "order_email"]))
        .count()
        .get_result(&mut app.db.conn())
        .expect("count")
}

/// Every job of an order: its emails, receipt and deliveries.
fn jobs_of(app: &TestApp, order: i64) -> i64 {
    jobs_all::table
        .filter(jobs_all::order_id.eq(order))
        .count()
        .get_result(&mut app.db.conn())
        .expect("count")
}

/// An order paid by `pi`, through a Stripe event `evt_pay_{pi}`.
async fn paid_by(app: &TestApp, pi: &str) -> i64 {
    let id = place(app).await;
    let body = intent_succeeded(
        &format!("evt_pay_{pi}"),
        json!(id.to_string()),
        TOTAL,
        "eur",
        pi,
    );
    assert_eq!(stripe(app, &body).await, "applied");
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_of_a_second_payment_is_held_and_the_order_stays_paid_by_the_first() {
    let app = spawn_app().await;
    add_source(&app, "stripe", SourceKind::Stripe, STRIPE_SECRET);
    let id = paid_by(&app, "pi_A").await;
    let again = intent_succeeded("evt_again", json!(id.to_string()), TOTAL, "eur", "pi_B");
    assert_eq!(stripe(&app, &again).await, "held");
    assert!(
        stored(&app, "evt_again")
            .1
            .expect("a reason")
            .contains("paid again")
    );

    // The operator refunds pi_B at Stripe, as the README says; its
    // charge.refunded names the same order and the whole amount.
    let jobs_before = jobs_of(&app, id);
    let refund_b = charge_refunded("evt_refund_b", id, TOTAL, "pi_B");
    assert_eq!(stripe(&app, &refund_b).await, "held");
    let (status, reason) = stored(&app, "evt_refund_b");
    assert_eq!(status, "held");
    let reason = reason.expect("a reason");
    assert!(
        reason.contains("refund of another payment")
            && reason.contains("pi_A")
            && reason.contains("pi_B"),
        "{reason}"
    );
    assert_eq!(order_status(&app, id), "paid", "pi_A still stands");
    assert_eq!(event_types(&app, id), ["order.placed", "order.paid"]);
    assert_eq!(
        emails(&app, id),
        1,
        "no refund email: only the confirmation"
    );
    assert_eq!(
        jobs_of(&app, id),
        jobs_before,
        "no email, no delivery, nothing queued"
    );

    // The refund of the payment that paid it is the order's refund.
    let refund_a = charge_refunded("evt_refund_a", id, TOTAL, "pi_A");
    assert_eq!(stripe(&app, &refund_a).await, "applied");
    assert_eq!(order_status(&app, id), "refunded");
    assert_eq!(emails(&app, id), 2);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_again_after_a_cancel_or_of_another_amount_leaves_the_order_as_it_is() {
    let app = spawn_app().await;
    add_source(&app, "stripe", SourceKind::Stripe, STRIPE_SECRET);

    // Already refunded: Stripe's copy under a new event id changes nothing.
    let refunded = paid_by(&app, "pi_r").await;
    let first = charge_refunded("evt_r_1", refunded, TOTAL, "pi_r");
    assert_eq!(stripe(&app, &first).await, "applied");
    let second = charge_refunded("evt_r_2", refunded, TOTAL, "pi_r");
    assert_eq!(stripe(&app, &second).await, "ignored");

    // Cancelled after payment: the refund returns that payment, the order
    // stays cancelled.
    let cancelled = paid_by(&app, "pi_c").await;
    crate::support::transition(
        &mut app.db.conn(),
        cancelled,
        "cancel",
        json!({"reason": "out of stock"}),
    );
    let refund = charge_refunded("evt_c", cancelled, TOTAL, "pi_c");
    assert_eq!(stripe(&app, &refund).await, "ignored");

    // A partial refund is not the order's refund.
    let partial = paid_by(&app, "pi_p").await;
    let refund = charge_refunded("evt_p", partial, TOTAL - 500, "pi_p");
    assert_eq!(stripe(&app, &refund).await, "held");

    for (message, words) in [
        ("evt_r_2", "is already refunded (pi_r)"),
        ("evt_c", "was cancelled after payment"),
        (
            "evt_p",
            "amount or currency differs: the message says 16.00 EUR, the order is 21.00 EUR",
        ),
    ] {
        let reason = stored(&app, message).1.expect("a reason");
        assert!(reason.contains(words), "{message}: {reason}");
    }
    for (id, status, events, mails) in [
        (
            refunded,
            "refunded",
            vec!["order.placed", "order.paid", "order.refunded"],
            2,
        ),
        // The confirmation and the cancellation's: none for the refund.
        (
            cancelled,
            "cancelled",
            vec!["order.placed", "order.paid", "order.cancelled"],
            2,
        ),
        (partial, "paid", vec!["order.placed", "order.paid"], 1),
    ] {
        assert_eq!(order_status(&app, id), status);
        assert_eq!(event_types(&app, id), events, "order {id}");
        assert_eq!(emails(&app, id), mails, "order {id}");
    }
    app.stop().await;
}

/// A Standard Webhooks message: its id is the `webhook-id` header, whatever
/// the payload holds.
async fn post_standard(app: &TestApp, webhook_id: &str, body: &Value) -> Value {
    let body = serde_json::to_vec(body).expect("JSON");
    let ts = now();
    let signature = standardwebhooks::Webhook::new(STANDARD_SECRET)
        .expect("secret")
        .sign(webhook_id, ts, &body)
        .expect("sign");
    let response = app
        .client
        .post(app.url("/inbound/billing"))
        .header("webhook-id", webhook_id)
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", signature)
        .body(body)
        .send()
        .await
        .expect("POST /inbound/billing");
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.expect("JSON")
}

fn paid_reference(app: &TestApp, order: i64) -> Value {
    let data: Value = order_events::table
        .filter(order_events::order_id.eq(order))
        .filter(order_events::event_type.eq("order.paid"))
        .select(order_events::data)
        .first(&mut app.db.conn())
        .expect("order.paid");
    data["payment_reference"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_standard_payment_applied_by_the_operator_is_known_by_its_webhook_id() {
    let app = spawn_app().await;
    add_source(&app, "billing", SourceKind::Standard, STANDARD_SECRET);
    // No reference in the data: the payment is known by its message id.
    let payment = |order: i64, amount: i64| {
        json!({"id": "evt_in_the_body", "type": "payment.succeeded",
               "timestamp": "2026-12-07T20:00:00Z",
               "data": {"order_id": order, "amount_cents": amount, "currency": "EUR"}})
    };
    let direct = place(&app).await;
    let answer = post_standard(&app, "msg_direct", &payment(direct, TOTAL)).await;
    assert_eq!(answer["status"], "applied");
    assert_eq!(paid_reference(&app, direct), "msg_direct");

    let short = place(&app).await;
    let answer = post_standard(&app, "msg_short", &payment(short, TOTAL - 100)).await;
    assert_eq!(answer["status"], "held");
    let held: i64 = inbox_messages::table
        .filter(inbox_messages::message_id.eq("msg_short"))
        .select(inbox_messages::id)
        .first(&mut app.db.conn())
        .expect("held");
    stdout_of(&cli(&app.db.url, &["inbox", "apply", &held.to_string()]));
    assert_eq!(order_status(&app, short), "paid");
    assert_eq!(
        paid_reference(&app, short),
        "msg_short",
        "applied under the id it was received with, as a direct payment is"
    );
    // So the provider's resend of that message is known as this payment.
    let again = post_standard(&app, "msg_short", &payment(short, TOTAL - 100)).await;
    assert_eq!(again["status"], "repeat");
    app.stop().await;
}

/// `body` with its `livemode` set.
fn with_livemode(body: &[u8], livemode: bool) -> Vec<u8> {
    let mut event: Value = serde_json::from_slice(body).expect("JSON");
    event["livemode"] = Value::Bool(livemode);
    serde_json::to_vec(&event).expect("JSON")
}

async fn status_at(app: &TestApp, source: &str, body: &[u8]) -> String {
    let response = post_stripe(app, source, STRIPE_SECRET, now(), body).await;
    assert_eq!(response.status(), StatusCode::OK);
    let answer: Value = response.json().await.expect("JSON");
    answer["status"].as_str().expect("a status").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripe_event_of_the_other_mode_than_its_source_s_is_ignored_with_the_reason() {
    let app = spawn_app().await;
    let url = app.db.url.clone();
    for (name, mode) in [("live", "live"), ("sandbox", "test"), ("either", "any")] {
        stdout_of(&cli(
            &url,
            &[
                "sources",
                "add",
                "--name",
                name,
                "--kind",
                "stripe",
                "--mode",
                mode,
                "--secret",
                STRIPE_SECRET,
            ],
        ));
    }
    let listed: Vec<Value> =
        serde_json::from_str(&stdout_of(&cli(&url, &["sources", "list", "--json"]))).expect("JSON");
    let modes: Vec<(&str, &str)> = listed
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or(""),
                s["mode"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        modes,
        [("either", "any"), ("live", "live"), ("sandbox", "test")]
    );
    let standard = cli(
        &url,
        &[
            "sources", "add", "--name", "b", "--kind", "standard", "--mode", "live",
        ],
    );
    assert_eq!(standard.status.code(), Some(2), "only Stripe marks a mode");

    let order = place(&app).await;
    let pay = |id: &str, livemode: bool| {
        with_livemode(
            &intent_succeeded(id, json!(order.to_string()), TOTAL, "eur", "pi_mode"),
            livemode,
        )
    };
    assert_eq!(
        status_at(&app, "live", &pay("evt_test_at_live", false)).await,
        "ignored"
    );
    assert_eq!(
        status_at(&app, "sandbox", &pay("evt_live_at_test", true)).await,
        "ignored"
    );
    assert_eq!(
        order_status(&app, order),
        "placed",
        "neither touched the order"
    );
    for (message, words) in [
        ("evt_test_at_live", "livemode false"),
        ("evt_live_at_test", "livemode true"),
    ] {
        let reason = stored(&app, message).1.expect("a reason");
        assert!(reason.contains(words), "{message}: {reason}");
    }
    assert_eq!(
        status_at(&app, "live", &pay("evt_live_at_live", true)).await,
        "applied"
    );
    assert_eq!(order_status(&app, order), "paid");
    let refund = with_livemode(
        &charge_refunded("evt_refund_any", order, TOTAL, "pi_mode"),
        false,
    );
    assert_eq!(
        status_at(&app, "either", &refund).await,
        "applied",
        "any takes both"
    );
    app.stop().await;
}
