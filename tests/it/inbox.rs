//! Payments in: `POST /inbound/{source}`. A provider's signed events pay and
//! refund orders exactly once, in the transaction that records them; every
//! message it cannot apply is kept with a reason; every refusal stores
//! nothing.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use diesel::prelude::*;
use order_service::api_keys::Scope;
use order_service::inbox::source::{self, SourceKind, SourceMode};
use order_service::inbox::verify::stripe_signature;
use order_service::schema::{inbox_messages, jobs_all, order_events, orders};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::app::{TestApp, create_api_key, error_of, http_client_with_key, spawn_app};
use crate::support::order_json;

/// Stripe's test-mode secrets look like this; the key is the string itself.
pub const STRIPE_SECRET: &str = "whsec_5d3e0f7a1b2c4d6e8f9a0b1c2d3e4f5a";
pub const STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// The order of `order_json`: 2 × 4.50 + 12.00 EUR.
pub(crate) const TOTAL: i64 = 2_100;

/// Waits out the API's snapshot of sources (`SOURCE_CACHE_TTL`): a source
/// added, rotated or removed takes effect within it, never at once.
pub async fn after_source_change() {
    tokio::time::sleep(order_service::inbox::source_cache::SOURCE_CACHE_TTL).await;
}

pub(crate) fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

pub(crate) fn add_source(app: &TestApp, name: &str, kind: SourceKind, secret: &str) {
    source::add(
        &mut app.db.conn(),
        name,
        kind,
        SourceMode::Any,
        secret,
        &order_service::sealed::Keyring::none(),
    )
    .expect("add source");
}

pub(crate) async fn place(app: &TestApp) -> i64 {
    let response = app.post_order(&order_json("Ada"), None).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    response.json::<Value>().await.expect("order")["id"]
        .as_i64()
        .expect("id")
}

/// An order placed and then cancelled by the customer: a payment for it
/// needs a refund, not a `paid` order.
pub(crate) async fn place_cancelled(app: &TestApp) -> i64 {
    let order = place(app).await;
    crate::support::transition(
        &mut app.db.conn(),
        order,
        "cancel",
        json!({"reason": "changed mind"}),
    );
    order
}

/// A Stripe event as Stripe sends it (the fields the shop reads, and a few
/// it does not).
pub fn stripe_event(id: &str, event_type: &str, object: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": id,
        "object": "event",
        "api_version": "2024-06-20",
        "created": now(),
        "livemode": false,
        "pending_webhooks": 1,
        "type": event_type,
        "data": {"object": object},
    }))
    .expect("event JSON")
}

pub fn intent_succeeded(id: &str, order: Value, amount: i64, currency: &str, pi: &str) -> Vec<u8> {
    stripe_event(
        id,
        "payment_intent.succeeded",
        json!({"id": pi, "object": "payment_intent", "amount": amount,
               "amount_received": amount, "currency": currency, "status": "succeeded",
               "metadata": {"order_id": order}}),
    )
}

pub(crate) fn charge_refunded(id: &str, order_id: i64, amount: i64, pi: &str) -> Vec<u8> {
    stripe_event(
        id,
        "charge.refunded",
        json!({"id": format!("ch_{id}"), "object": "charge", "amount": amount,
               "amount_refunded": amount, "currency": "eur", "payment_intent": pi,
               "refunded": true, "metadata": {"order_id": order_id.to_string()}}),
    )
}

pub(crate) async fn post_stripe(
    app: &TestApp,
    source: &str,
    secret: &str,
    ts: i64,
    body: &[u8],
) -> reqwest::Response {
    app.client
        .post(app.url(&format!("/inbound/{source}")))
        .header("content-type", "application/json")
        .header("stripe-signature", stripe_signature(secret, ts, body))
        .body(body.to_vec())
        .send()
        .await
        .expect("POST /inbound")
}

/// Posts a Stripe-signed event and returns the answer's `status`.
pub(crate) async fn stripe(app: &TestApp, body: &[u8]) -> String {
    let response = post_stripe(app, "stripe", STRIPE_SECRET, now(), body).await;
    assert_eq!(response.status(), StatusCode::OK);
    response.json::<Value>().await.expect("JSON")["status"]
        .as_str()
        .expect("a status")
        .to_owned()
}

pub(crate) fn order_status(app: &TestApp, id: i64) -> String {
    orders::table
        .find(id)
        .select(orders::status)
        .first(&mut app.db.conn())
        .expect("order")
}

pub(crate) fn event_types(app: &TestApp, id: i64) -> Vec<String> {
    order_events::table
        .filter(order_events::order_id.eq(id))
        .order(order_events::seq)
        .select(order_events::event_type)
        .load(&mut app.db.conn())
        .expect("events")
}

/// (status, reason) of the stored message with this provider id.
pub(crate) fn stored(app: &TestApp, message_id: &str) -> (String, Option<String>) {
    let (status, reason): (Option<String>, Option<String>) = inbox_messages::table
        .filter(inbox_messages::message_id.eq(message_id))
        .select((inbox_messages::status, inbox_messages::reason))
        .first(&mut app.db.conn())
        .expect("a stored message");
    (status.expect("a status"), reason)
}

fn stored_count(app: &TestApp) -> i64 {
    inbox_messages::table
        .count()
        .get_result(&mut app.db.conn())
        .expect("count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripe_payment_pays_its_order_once_and_a_repeat_changes_nothing() {
    let app = spawn_app().await;
    add_source(&app, "stripe", SourceKind::Stripe, STRIPE_SECRET);
    let id = place(&app).await;
    let body = intent_succeeded("evt_pay_1", json!(id.to_string()), TOTAL, "eur", "pi_1");

    assert_eq!(stripe(&app, &body).await, "applied");
    assert_eq!(order_status(&app, id), "paid");
    let (event_id, data, cause): (i64, Value, Option<i64>) = order_events::table
        .filter(order_events::order_id.eq(id))
        .filter(order_events::event_type.eq("order.paid"))
        .select((
            order_events::id,
            order_events::data,
            order_events::inbox_message_id,
        ))
        .first(&mut app.db.conn())
        .expect("order.paid");
    assert_eq!(data["payment_reference"], "pi_1");
    let message: i64 = inbox_messages::table
        .filter(inbox_messages::message_id.eq("evt_pay_1"))
        .select(inbox_messages::id)
        .first(&mut app.db.conn())
        .expect("the message");
    assert_eq!(
        cause,
        Some(message),
        "the event names the message that caused it"
    );
    let deliveries: i64 = jobs_all::table
        .filter(jobs_all::payload.contains(json!({"event_id": event_id})))
        .count()
        .get_result(&mut app.db.conn())
        .expect("count");
    assert_eq!(deliveries, 1, "the event's delivery commits with it");

    // Stripe retries; much later, and under a fresh signature.
    assert_eq!(stripe(&app, &body).await, "repeat");
    assert_eq!(event_types(&app, id), ["order.placed", "order.paid"]);
    assert_eq!(stored_count(&app), 1);
    app.stop().await;
}

/// The tests sign as Stripe does: Stripe's own Python library accepts the
/// header they make. CI installs the package (`.ci/run`); elsewhere the
/// check runs when python3 can import it.
#[test]
fn stripes_own_verifier_accepts_the_signature_the_tests_make() {
    const SCRIPT: &str = r#"
import json, sys
try:
    import stripe
except ImportError:
    sys.exit(3)
req = json.load(sys.stdin)
stripe.WebhookSignature.verify_header(req["payload"], req["header"], req["secret"], tolerance=300)
try:
    stripe.WebhookSignature.verify_header(req["payload"] + " ", req["header"], req["secret"], tolerance=300)
except stripe.SignatureVerificationError:
    print("verified")
"#;
    let payload = String::from_utf8(intent_succeeded(
        "evt_py",
        json!("7"),
        TOTAL,
        "eur",
        "pi_py",
    ))
    .expect("UTF-8");
    let header = stripe_signature(STRIPE_SECRET, now(), payload.as_bytes());
    let input = json!({"payload": payload, "header": header, "secret": STRIPE_SECRET});
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let in_ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let child = Command::new(&python)
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        assert!(!in_ci, "CI must run Stripe's verifier: {python} is missing");
        eprintln!("SKIPPED: no {python} to run Stripe's verifier");
        return;
    };
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.to_string().as_bytes())
        .expect("write");
    let output = child.wait_with_output().expect("python finishes");
    if output.status.code() == Some(3) {
        assert!(!in_ci, "CI must run Stripe's verifier: pip install stripe");
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: Stripe's verifier was not run: python3 -m pip install stripe"
        );
        return;
    }
    assert!(
        output.status.success() && output.stdout.starts_with(b"verified"),
        "Stripe's verifier refused the test's header: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_webhooks_messages_signed_by_the_reference_crate_pay_and_refund() {
    let app = spawn_app().await;
    add_source(&app, "billing", SourceKind::Standard, STANDARD_SECRET);
    let id = place(&app).await;
    let signer = standardwebhooks::Webhook::new(STANDARD_SECRET).expect("secret");
    let send = |msg_id: &'static str, event_type: &'static str| {
        let body = serde_json::to_vec(&json!({
            "type": event_type,
            "timestamp": "2026-12-07T20:00:00Z",
            "data": {"order_id": id, "amount_cents": TOTAL, "currency": "EUR", "reference": "pay_9"},
        }))
        .expect("JSON");
        let ts = now();
        let signature = signer.sign(msg_id, ts, &body).expect("sign");
        app.client
            .post(app.url("/inbound/billing"))
            .header("webhook-id", msg_id)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
    };
    let answer: Value = send("msg_1", "payment.succeeded")
        .await
        .expect("send")
        .json()
        .await
        .expect("JSON");
    assert_eq!(answer["status"], "applied");
    let answer: Value = send("msg_2", "payment.refunded")
        .await
        .expect("send")
        .json()
        .await
        .expect("JSON");
    assert_eq!(answer["status"], "applied");
    assert_eq!(order_status(&app, id), "refunded");
    assert_eq!(
        event_types(&app, id),
        ["order.placed", "order.paid", "order.refunded"]
    );
    // The customer is told: an email for the refund, with the order's others.
    let emails: i64 = jobs_all::table
        .filter(jobs_all::order_id.eq(id))
        .filter(jobs_all::kind.eq_any(["confirmation_email", "order_email"]))
        .count()
        .get_result(&mut app.db.conn())
        .expect("count");
    assert_eq!(emails, 2, "the confirmation and the refund's email");
    let answer: Value = send("msg_2", "payment.refunded")
        .await
        .expect("send")
        .json()
        .await
        .expect("JSON");
    assert_eq!(answer["status"], "repeat");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkout_payment_s_two_events_apply_once_and_the_second_is_ignored() {
    let app = spawn_app().await;
    add_source(&app, "stripe", SourceKind::Stripe, STRIPE_SECRET);
    let id = place(&app).await;
    let session = stripe_event(
        "evt_cs",
        "checkout.session.completed",
        json!({"id": "cs_1", "object": "checkout.session", "client_reference_id": id.to_string(),
               "amount_total": TOTAL, "currency": "eur", "payment_intent": "pi_cs",
               "payment_status": "paid", "metadata": {}}),
    );
    assert_eq!(stripe(&app, &session).await, "applied");
    let intent = intent_succeeded("evt_pi", json!(id.to_string()), TOTAL, "eur", "pi_cs");
    assert_eq!(stripe(&app, &intent).await, "ignored");
    let (_, reason) = stored(&app, "evt_pi");
    assert!(reason.expect("a reason").contains("already paid by pi_cs"));
    assert_eq!(event_types(&app, id), ["order.placed", "order.paid"]);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_held_reason_keeps_the_message_and_leaves_the_order_untouched() {
    let app = spawn_app().await;
    add_source(&app, "stripe", SourceKind::Stripe, STRIPE_SECRET);

    let wrong_amount = place(&app).await;
    let body = intent_succeeded("evt_amount", json!(wrong_amount), TOTAL - 1, "eur", "pi_a");
    assert_eq!(stripe(&app, &body).await, "held");
    let wrong_currency = place(&app).await;
    let body = intent_succeeded("evt_currency", json!(wrong_currency), TOTAL, "usd", "pi_c");
    assert_eq!(stripe(&app, &body).await, "held");

    let cancelled = place_cancelled(&app).await;
    let body = intent_succeeded("evt_late", json!(cancelled), TOTAL, "eur", "pi_late");
    assert_eq!(stripe(&app, &body).await, "held");

    let twice = place(&app).await;
    let first = intent_succeeded("evt_first", json!(twice), TOTAL, "eur", "pi_first");
    assert_eq!(stripe(&app, &first).await, "applied");
    let second = intent_succeeded("evt_second", json!(twice), TOTAL, "eur", "pi_second");
    assert_eq!(stripe(&app, &second).await, "held");

    let unpaid = place(&app).await;
    let refund = charge_refunded("evt_refund", unpaid, TOTAL, "pi_x");
    assert_eq!(stripe(&app, &refund).await, "held");

    for (message, words) in [
        (
            "evt_amount",
            "amount or currency differs: the message says 20.99 EUR, the order is 21.00 EUR",
        ),
        ("evt_currency", "the message says 21.00 USD"),
        ("evt_late", "refund needed"),
        ("evt_second", "paid again under another reference"),
        ("evt_refund", "refund of an order not paid"),
    ] {
        let (status, reason) = stored(&app, message);
        assert_eq!(status, "held", "{message}");
        let reason = reason.expect("a reason");
        assert!(reason.contains(words), "{message}: {reason}");
    }
    for (id, status, events) in [
        (wrong_amount, "placed", 1),
        (wrong_currency, "placed", 1),
        (cancelled, "cancelled", 2),
        (twice, "paid", 2),
        (unpaid, "placed", 1),
    ] {
        assert_eq!(order_status(&app, id), status);
        assert_eq!(event_types(&app, id).len(), events);
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_without_an_order_are_stored_ignored_or_unmatched_with_a_reason() {
    let app = spawn_app().await;
    add_source(&app, "stripe", SourceKind::Stripe, STRIPE_SECRET);
    let other = stripe_event("evt_other", "customer.created", json!({"id": "cus_1"}));
    assert_eq!(stripe(&app, &other).await, "ignored");
    let missing = stripe_event(
        "evt_missing",
        "payment_intent.succeeded",
        json!({"id": "pi_m", "amount_received": 5, "currency": "eur", "metadata": {}}),
    );
    assert_eq!(stripe(&app, &missing).await, "ignored");
    let word = intent_succeeded("evt_word", json!("abc"), TOTAL, "eur", "pi_w");
    assert_eq!(stripe(&app, &word).await, "unmatched");
    let nobody = intent_succeeded("evt_nobody", json!("987654"), TOTAL, "eur", "pi_n");
    assert_eq!(stripe(&app, &nobody).await, "unmatched");
    for (message, words) in [
        (
            "evt_other",
            "customer.created is not an event this shop acts on",
        ),
        (
            "evt_missing",
            "no order id in data.object.metadata.order_id",
        ),
        ("evt_word", "order id \"abc\" is not a number"),
        ("evt_nobody", "there is no order 987654"),
    ] {
        let (_, reason) = stored(&app, message);
        assert!(
            reason.as_deref().unwrap_or_default().contains(words),
            "{message}: {reason:?}"
        );
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_messages_are_answered_4xx_and_store_nothing() {
    let app = spawn_app().await;
    add_source(&app, "stripe", SourceKind::Stripe, STRIPE_SECRET);
    let id = place(&app).await;
    let body = intent_succeeded("evt_bad", json!(id), TOTAL, "eur", "pi_bad");
    let post = |path: &str, signature: Option<String>, body: Vec<u8>| {
        let mut request = app.client.post(app.url(path)).body(body);
        if let Some(signature) = signature {
            request = request.header("stripe-signature", signature);
        }
        request.send()
    };
    let refused = [
        (
            "no signature",
            post("/inbound/stripe", None, body.clone()).await,
        ),
        (
            "a wrong secret",
            post(
                "/inbound/stripe",
                Some(stripe_signature(
                    "whsec_not_the_secret_at_all",
                    now(),
                    &body,
                )),
                body.clone(),
            )
            .await,
        ),
        (
            "another body",
            post(
                "/inbound/stripe",
                Some(stripe_signature(STRIPE_SECRET, now(), b"{}")),
                body.clone(),
            )
            .await,
        ),
        (
            "an unknown source",
            post(
                "/inbound/paypal",
                Some(stripe_signature(STRIPE_SECRET, now(), &body)),
                body.clone(),
            )
            .await,
        ),
        (
            "a stale timestamp",
            post(
                "/inbound/stripe",
                Some(stripe_signature(STRIPE_SECRET, now() - 301, &body)),
                body.clone(),
            )
            .await,
        ),
        (
            "a future timestamp",
            post(
                "/inbound/stripe",
                Some(stripe_signature(STRIPE_SECRET, now() + 301, &body)),
                body.clone(),
            )
            .await,
        ),
    ];
    for (what, response) in refused {
        let response = response.expect("POST");
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{what}");
        assert_eq!(
            response.text().await.expect("body"),
            r#"{"error":{"code":"unauthorized"}}"#,
            "{what}: one body for every refusal"
        );
    }

    // A rotation: the old secret verifies during its keep-old window only.
    let new_secret = "whsec_the_rotated_secret_0001";
    source::rotate_secret(
        &mut app.db.conn(),
        "stripe",
        new_secret,
        Duration::from_secs(3600),
        &order_service::sealed::Keyring::none(),
    )
    .expect("rotate");
    after_source_change().await;
    let during = post_stripe(
        &app,
        "stripe",
        STRIPE_SECRET,
        now(),
        &stripe_event("evt_rot", "customer.created", json!({})),
    )
    .await;
    assert_eq!(
        during.status(),
        StatusCode::OK,
        "the old secret still verifies"
    );
    source::rotate_secret(
        &mut app.db.conn(),
        "stripe",
        "whsec_the_rotated_secret_0002",
        Duration::ZERO,
        &order_service::sealed::Keyring::none(),
    )
    .expect("rotate");
    after_source_change().await;
    let after = post_stripe(&app, "stripe", new_secret, now(), &body).await;
    assert_eq!(after.status(), StatusCode::UNAUTHORIZED);

    let current = "whsec_the_rotated_secret_0002";
    let big = vec![b' '; 256 * 1024 + 1];
    let too_large = post(
        "/inbound/stripe",
        Some(stripe_signature(current, now(), &big)),
        big,
    )
    .await;
    error_of(too_large.expect("POST"), StatusCode::PAYLOAD_TOO_LARGE).await;
    let text = b"payment received".to_vec();
    let not_json = post(
        "/inbound/stripe",
        Some(stripe_signature(current, now(), &text)),
        text,
    )
    .await;
    error_of(not_json.expect("POST"), StatusCode::BAD_REQUEST).await;

    assert_eq!(
        stored_count(&app),
        1,
        "only the message verified during the rotation"
    );
    assert_eq!(order_status(&app, id), "placed");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_through_the_api_needs_its_scope_and_moves_a_paid_order() {
    let app = spawn_app().await;
    let id = place(&app).await;
    let refund = |client: reqwest::Client| {
        let url = app.url(&format!("/orders/{id}/refund"));
        async move {
            client
                .post(url)
                .header("content-type", "application/json")
                .body(r#"{"reason": "damaged in transit"}"#)
                .send()
                .await
                .expect("POST refund")
        }
    };
    let not_paid = refund(app.client.clone()).await;
    error_of(not_paid, StatusCode::CONFLICT).await;
    crate::support::transition(
        &mut app.db.conn(),
        id,
        "pay",
        json!({"payment_reference": "pi_api"}),
    );
    let payer = create_api_key(&app.db.url, "payer", &[Scope::Pay]);
    let refused = refund(http_client_with_key(&payer)).await;
    let error = error_of(refused, StatusCode::FORBIDDEN).await;
    assert!(
        error["message"]
            .as_str()
            .unwrap_or_default()
            .contains("orders:refund")
    );
    let refunder = create_api_key(&app.db.url, "refunder", &[Scope::Refund]);
    let refunded = refund(http_client_with_key(&refunder)).await;
    assert_eq!(refunded.status(), StatusCode::OK);
    let view: Value = refunded.json().await.expect("order");
    assert_eq!(view["status"], "refunded");
    assert_eq!(
        event_types(&app, id),
        ["order.placed", "order.paid", "order.refunded"]
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_are_kept_for_the_retention_and_forgotten_after_it() {
    let app = spawn_app().await;
    add_source(&app, "stripe", SourceKind::Stripe, STRIPE_SECRET);
    let inside = stripe_event("evt_inside", "customer.created", json!({}));
    let outside = stripe_event("evt_outside", "customer.created", json!({}));
    assert_eq!(stripe(&app, &inside).await, "ignored");
    assert_eq!(stripe(&app, &outside).await, "ignored");
    let mut conn = app.db.conn();
    for (id, age) in [
        ("evt_inside", "34 days 23 hours 59 minutes"),
        ("evt_outside", "35 days 1 minute"),
    ] {
        diesel::sql_query(format!(
            "UPDATE inbox_messages SET received_at = now() - interval '{age}' WHERE message_id = '{id}'"
        ))
        .execute(&mut conn)
        .expect("age");
    }
    // What `serve` runs hourly with INBOX_RETENTION's default.
    let pruned = order_service::outbox_core::dedupe::prune_messages(
        &mut conn,
        order_service::inbox::DEFAULT_RETENTION,
        100,
    )
    .expect("prune");
    assert_eq!(pruned, 1);
    assert_eq!(
        stripe(&app, &inside).await,
        "repeat",
        "a late retry inside the retention"
    );
    let left: Vec<String> = inbox_messages::table
        .select(inbox_messages::message_id)
        .load(&mut conn)
        .expect("ids");
    assert_eq!(left, ["evt_inside"]);
    app.stop().await;
}

pub(crate) fn cli(url: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(args)
        .env("DATABASE_URL", url)
        .env("USER", "ops")
        .output()
        .expect("run outbox-relay")
}

pub(crate) fn stdout_of(output: &std::process::Output) -> String {
    assert!(
        output.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_manage_sources_and_apply_or_dismiss_held_messages_audited() {
    let app = spawn_app().await;
    let url = app.db.url.clone();
    let added = stdout_of(&cli(
        &url,
        &[
            "sources",
            "add",
            "--name",
            "stripe",
            "--kind",
            "stripe",
            "--secret",
            STRIPE_SECRET,
            "--json",
        ],
    ));
    let added: Value = serde_json::from_str(&added).expect("JSON");
    assert_eq!(added["name"], "stripe");
    let bad = cli(
        &url,
        &[
            "sources", "add", "--name", "x", "--kind", "stripe", "--secret", "short",
        ],
    );
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        !String::from_utf8_lossy(&bad.stderr).contains("short"),
        "the secret is not echoed"
    );
    let listed = stdout_of(&cli(&url, &["sources", "list"]));
    assert!(
        listed.contains("/inbound/stripe") && !listed.contains(STRIPE_SECRET),
        "{listed}"
    );

    let short = place(&app).await;
    let body = intent_succeeded("evt_short", json!(short), TOTAL - 100, "eur", "pi_short");
    assert_eq!(stripe(&app, &body).await, "held");
    let late = place_cancelled(&app).await;
    let body = intent_succeeded("evt_late", json!(late), TOTAL, "eur", "pi_late");
    assert_eq!(stripe(&app, &body).await, "held");
    let held = stdout_of(&cli(&url, &["inbox", "list", "--status", "held", "--json"]));
    let held: Vec<Value> = serde_json::from_str(&held).expect("JSON");
    assert_eq!(held.len(), 2);
    let id_of = |message: &str| {
        held.iter()
            .find(|m| m["message_id"] == message)
            .and_then(|m| m["id"].as_i64())
            .expect("listed")
            .to_string()
    };

    // The operator checked the short payment and accepts it.
    stdout_of(&cli(&url, &["inbox", "apply", &id_of("evt_short")]));
    assert_eq!(order_status(&app, short), "paid");
    assert_eq!(stored(&app, "evt_short").0, "applied");
    // A cancelled order cannot become paid: apply refuses and changes nothing.
    let refused = cli(&url, &["inbox", "apply", &id_of("evt_late")]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("cannot become paid"));
    // So the operator refunds at Stripe and dismisses it.
    stdout_of(&cli(&url, &["inbox", "dismiss", &id_of("evt_late")]));
    assert_eq!(stored(&app, "evt_late").0, "dismissed");
    assert_eq!(order_status(&app, late), "cancelled");
    let again = cli(&url, &["inbox", "dismiss", &id_of("evt_late")]);
    assert_eq!(again.status.code(), Some(1), "only a held message");

    let audit: Vec<(String, String)> =
        diesel::sql_query("SELECT actor, action FROM admin_audit ORDER BY id")
            .load::<AuditRow>(&mut app.db.conn())
            .expect("audit")
            .into_iter()
            .map(|r| (r.actor, r.action))
            .collect();
    assert_eq!(
        audit,
        [
            ("cli:ops".to_owned(), "inbox.apply".to_owned()),
            ("cli:ops".to_owned(), "inbox.dismiss".to_owned())
        ]
    );

    let metrics = reqwest::get(app.metrics_url("/metrics"))
        .await
        .expect("GET /metrics on METRICS_ADDR")
        .text()
        .await
        .expect("metrics");
    assert!(
        metrics.contains(r#"outbox_inbox_messages_total{source="stripe",status="held"}"#),
        "{metrics}"
    );

    stdout_of(&cli(
        &url,
        &["sources", "rotate-secret", "stripe", "--keep-old", "0s"],
    ));
    after_source_change().await;
    let old = post_stripe(&app, "stripe", STRIPE_SECRET, now(), &body).await;
    assert_eq!(old.status(), StatusCode::UNAUTHORIZED);
    stdout_of(&cli(&url, &["sources", "remove", "stripe"]));
    assert_eq!(
        cli(&url, &["sources", "remove", "stripe"]).status.code(),
        Some(1)
    );
    app.stop().await;
}

#[derive(QueryableByName)]
struct AuditRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    actor: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    action: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_lists_held_messages_beside_their_orders_and_applies_or_dismisses_them() {
    use crate::admin::{
        OPERATOR, VIEWER, admin_settings, http_login, log_in, post_form, raw_client,
        screenshot_path,
    };
    let app = crate::support::app::spawn_app_with(admin_settings()).await;
    add_source(&app, "stripe", SourceKind::Stripe, STRIPE_SECRET);
    let paid = place(&app).await;
    let body = intent_succeeded("evt_ok", json!(paid), TOTAL, "eur", "pi_ok");
    assert_eq!(stripe(&app, &body).await, "applied");
    let short = place(&app).await;
    let body = intent_succeeded("evt_short", json!(short), 1_900, "eur", "pi_short");
    assert_eq!(stripe(&app, &body).await, "held");
    let late = place_cancelled(&app).await;
    let body = intent_succeeded("evt_late", json!(late), TOTAL, "eur", "pi_late");
    assert_eq!(stripe(&app, &body).await, "held");
    let id_of = |message: &str| -> i64 {
        inbox_messages::table
            .filter(inbox_messages::message_id.eq(message))
            .select(inbox_messages::id)
            .first(&mut app.db.conn())
            .expect("id")
    };

    let client = raw_client();
    let (cookie, csrf) = http_login(&client, &app, OPERATOR).await;
    let page = client
        .get(app.url("/admin/inbox?status=held"))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("GET")
        .text()
        .await
        .expect("page");
    assert!(page.contains("the message says 19.00 EUR"), "{page}");
    assert!(
        page.contains(&format!("#{short}</a> placed, ")),
        "the order beside it"
    );
    assert!(
        page.contains("refund needed") && !page.contains("evt_ok"),
        "held only"
    );
    let other = client
        .get(app.url("/admin/inbox?source=paypal"))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("GET")
        .text()
        .await
        .expect("page");
    assert!(other.contains("No messages match this filter"));

    let apply = format!("/admin/inbox/{}/apply", id_of("evt_short"));
    let forged = post_form(&client, &app, &apply, &cookie, &[("csrf", "forged")]).await;
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    let (viewer, viewer_csrf) = http_login(&client, &app, VIEWER).await;
    let read_only = post_form(&client, &app, &apply, &viewer, &[("csrf", &viewer_csrf)]).await;
    assert_eq!(read_only.status(), StatusCode::FORBIDDEN);
    assert_eq!(order_status(&app, short), "placed");
    let applied = post_form(&client, &app, &apply, &cookie, &[("csrf", &csrf)]).await;
    assert_eq!(applied.status(), StatusCode::SEE_OTHER);
    assert_eq!(order_status(&app, short), "paid");
    let refused = post_form(
        &client,
        &app,
        &format!("/admin/inbox/{}/apply", id_of("evt_late")),
        &cookie,
        &[("csrf", &csrf)],
    )
    .await;
    assert_eq!(
        refused.status(),
        StatusCode::BAD_REQUEST,
        "a cancelled order cannot become paid"
    );

    if let Some(browser) = crate::support::browser::Browser::start().await {
        browser.viewport(false).await;
        log_in(&browser, &app, OPERATOR).await;
        browser.goto(&app.url("/admin/inbox")).await;
        browser.screenshot(&screenshot_path("inbox-desktop")).await;
        browser.viewport(true).await;
        browser.goto(&app.url("/admin/inbox")).await;
        browser.screenshot(&screenshot_path("inbox-phone")).await;
        browser.viewport(false).await;
        browser.goto(&app.url("/admin/inbox?status=held")).await;
        browser.click("td.actions button.secondary").await;
        crate::admin::wait_for_text(&browser, "Dismissed message").await;
        browser.quit().await;
        assert_eq!(stored(&app, "evt_late").0, "dismissed");
        assert_eq!(order_status(&app, late), "cancelled");
    }
    let actions: Vec<String> =
        diesel::sql_query("SELECT actor, action FROM admin_audit ORDER BY id")
            .load::<AuditRow>(&mut app.db.conn())
            .expect("audit")
            .into_iter()
            .map(|r| r.action)
            .collect();
    assert_eq!(actions.first().map(String::as_str), Some("inbox.apply"));
    app.stop().await;
}
