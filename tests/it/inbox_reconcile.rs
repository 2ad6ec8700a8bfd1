//! Reconciliation: the events Stripe's log lists that never arrived as
//! webhooks are applied through the webhook's own path, `via = reconcile`;
//! what arrived is left as it is. Against a local server speaking Stripe's
//! `GET /v1/events` (outbox-dev-tools' `StripeEventLog`).

use std::time::{Duration, Instant};

use diesel::prelude::*;
use order_service::inbox::reconcile::state as reconcile_state;
use order_service::inbox::reconcile::stripe_events::{
    HANDLED_TYPES, RetryPolicy, StripeError, StripeEvents,
};
use order_service::inbox::reconcile::{ReconcileError, Reconciler, Report};
use order_service::inbox::source::{self, SourceKind, SourceMode};
use order_service::schema::{inbox_messages, jobs_all, source_reconciliations, sources};
use order_service::sealed::Keyring;
use outbox_dev_tools::demo::sinks::stripe_events::{
    StripeEventLog, payment_succeeded, stripe_event,
};
use serde_json::json;

use crate::inbox::{
    STRIPE_SECRET, TOTAL, intent_succeeded, now, order_status, place, stored, stripe,
};
use crate::support::app::{TestApp, spawn_app};

/// A restricted key of test mode, as Stripe makes them.
pub(crate) const API_KEY: &str = "rk_test_51ReconcileKey0123456789abcdef";

/// Stripe's log with the source `stripe` reading it with [`API_KEY`].
pub(crate) async fn log_and_source(app: &TestApp) -> StripeEventLog {
    let log = StripeEventLog::start(API_KEY).await.expect("the event log");
    source::add_with_api_key(
        &mut app.db.conn(),
        "stripe",
        SourceKind::Stripe,
        SourceMode::Any,
        STRIPE_SECRET,
        Some(API_KEY),
        &Keyring::none(),
    )
    .expect("add source");
    log
}

/// Quick retries: the tests' throttles and outages last one answer.
pub(crate) fn reconciler(app: &TestApp, log: &StripeEventLog, retry: RetryPolicy) -> Reconciler {
    Reconciler {
        pool: app.db.pool(4),
        events: StripeEvents::new(&log.base_url(), retry).expect("a client"),
        keys: Keyring::none(),
        enqueuer: order_service::orders::order_enqueuer(),
        max_attempts: 8,
    }
}

pub(crate) fn quick() -> RetryPolicy {
    RetryPolicy {
        attempts: 4,
        base: Duration::from_millis(50),
        max_wait: Duration::from_secs(5),
    }
}

pub(crate) fn via_of(app: &TestApp, message_id: &str) -> (String, chrono::DateTime<chrono::Utc>) {
    inbox_messages::table
        .filter(inbox_messages::message_id.eq(message_id))
        .select((inbox_messages::via, inbox_messages::received_at))
        .first(&mut app.db.conn())
        .expect("a stored message")
}

fn stored_via(app: &TestApp, via: &str) -> i64 {
    inbox_messages::table
        .filter(inbox_messages::via.eq(via))
        .count()
        .get_result(&mut app.db.conn())
        .expect("count")
}

fn counts(report: &Report) -> (u64, u64, u64, u64) {
    (
        report.fetched,
        report.recovered,
        report.already,
        report.pages,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_the_webhooks_missed_is_recovered_across_pages_and_a_second_run_changes_nothing()
 {
    let app = spawn_app().await;
    let log = log_and_source(&app).await;
    let orders = [place(&app).await, place(&app).await, place(&app).await];
    let by_webhook = [place(&app).await, place(&app).await];
    // 230 events of the handled types over the last two days, 600 s apart:
    // five pay real orders, the rest name orders this shop never had.
    let start = now() - 48 * 3600;
    let created = |i: i64| start + i * 600;
    for (i, order) in orders.iter().chain(&by_webhook).enumerate() {
        let i = i64::try_from(i).expect("small");
        log.add(payment_succeeded(
            &format!("evt_pay_{i}"),
            created(i),
            *order,
            TOTAL,
            "eur",
            &format!("pi_{i}"),
        ));
    }
    for i in 5..230 {
        log.add(payment_succeeded(
            &format!("evt_other_{i}"),
            created(i),
            900_000 + i,
            TOTAL,
            "eur",
            &format!("pi_other_{i}"),
        ));
    }
    // Types the shop does not act on: never asked for.
    for i in 0..15 {
        log.add(stripe_event(
            &format!("evt_customer_{i}"),
            "customer.created",
            created(i),
            json!({"id": format!("cus_{i}"), "object": "customer"}),
        ));
    }
    // Two arrived as webhooks before the run.
    for (i, order) in by_webhook.iter().enumerate() {
        let id = format!("evt_pay_{}", i + 3);
        let body = intent_succeeded(
            &id,
            json!(order.to_string()),
            TOTAL,
            "eur",
            &format!("pi_{}", i + 3),
        );
        assert_eq!(stripe(&app, &body).await, "applied");
    }
    let before: Vec<_> = (3..5)
        .map(|i| via_of(&app, &format!("evt_pay_{i}")))
        .collect();
    let reconciler = reconciler(&app, &log, quick());

    let first = reconciler.source("stripe", None).await.expect("reconciled");

    assert_eq!(counts(&first), (230, 228, 2, 3), "{first:?}");
    for order in orders {
        assert_eq!(order_status(&app, order), "paid");
    }
    for i in 0..3 {
        assert_eq!(via_of(&app, &format!("evt_pay_{i}")).0, "reconcile");
    }
    let after: Vec<_> = (3..5)
        .map(|i| via_of(&app, &format!("evt_pay_{i}")))
        .collect();
    assert_eq!(after, before, "what arrived by webhook is untouched");
    assert_eq!(stored(&app, "evt_other_100").0, "unmatched");
    assert_eq!(stored_via(&app, "reconcile"), 228);
    let customers: i64 = inbox_messages::table
        .filter(inbox_messages::message_id.like("evt_customer_%"))
        .count()
        .get_result(&mut app.db.conn())
        .expect("count");
    assert_eq!(customers, 0, "types the shop ignores are not asked for");
    // A recovered payment enqueued its order's jobs, as a webhook's does.
    let paid_jobs: i64 = jobs_all::table
        .filter(jobs_all::order_id.eq(orders[0]))
        .count()
        .get_result(&mut app.db.conn())
        .expect("count");
    assert!(
        paid_jobs > 3,
        "the payment's jobs were enqueued ({paid_jobs})"
    );
    let requests = log.requests();
    assert_eq!(requests.len(), 3, "{requests:?}");
    let handled: Vec<String> = HANDLED_TYPES.iter().map(|t| (*t).to_owned()).collect();
    assert!(
        requests
            .iter()
            .all(|r| r.limit == 100 && r.types == handled)
    );
    assert_eq!(requests[0].starting_after, None);
    assert_eq!(requests[1].starting_after.as_deref(), Some("evt_other_130"));
    assert_eq!(requests[2].starting_after.as_deref(), Some("evt_other_30"));
    let default_since = requests[0].created_gte.expect("created[gte]");
    assert!(
        (default_since - (now() - 72 * 3600)).abs() < 60,
        "{default_since}"
    );

    let second = reconciler.source("stripe", None).await.expect("reconciled");

    assert_eq!(second.recovered, 0, "{second:?}");
    assert_eq!(second.already, second.fetched);
    assert_eq!(
        second.pages, 1,
        "the watermark spares the pages already read"
    );
    assert!(
        second.fetched <= 2,
        "only the overlap is listed again: {second:?}"
    );
    let source_id: i64 = sources::table
        .filter(sources::name.eq("stripe"))
        .select(sources::id)
        .first(&mut app.db.conn())
        .expect("source");
    let watermark = reconcile_state::watermark(&mut app.db.conn(), source_id)
        .expect("read")
        .expect("a watermark");
    assert_eq!(watermark.timestamp(), created(229) - 600);
    assert_eq!(log.requests()[3].created_gte, Some(watermark.timestamp()));
    assert_eq!(stored_via(&app, "reconcile"), 228);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_key_is_an_error_naming_the_source_and_applies_nothing() {
    let app = crate::support::app::spawn_app_with(crate::admin::admin_settings()).await;
    let log = StripeEventLog::start("rk_test_the_key_stripe_knows_0123456")
        .await
        .expect("the event log");
    source::add_with_api_key(
        &mut app.db.conn(),
        "stripe",
        SourceKind::Stripe,
        SourceMode::Any,
        STRIPE_SECRET,
        Some(API_KEY),
        &Keyring::none(),
    )
    .expect("add source");
    let order = place(&app).await;
    log.add(payment_succeeded(
        "evt_1",
        now(),
        order,
        TOTAL,
        "eur",
        "pi_1",
    ));

    let error = reconciler(&app, &log, quick())
        .source("stripe", None)
        .await
        .expect_err("refused");

    assert!(
        matches!(
            error,
            ReconcileError::Stripe(StripeError::KeyRefused { .. })
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.starts_with("stripe refused the API key of source \"stripe\""),
        "{message}"
    );
    assert!(
        !message.contains(API_KEY),
        "the key is never shown: {message}"
    );
    assert_eq!(log.requests().len(), 1, "a refused key is not tried again");
    assert_eq!(order_status(&app, order), "placed");
    assert_eq!(stored_via(&app, "reconcile"), 0);
    let last_error: Option<String> = source_reconciliations::table
        .select(source_reconciliations::last_error)
        .first(&mut app.db.conn())
        .expect("the run is recorded");
    assert!(
        last_error.is_some_and(|e| e.contains("refused the API key")),
        "the dashboard shows why"
    );

    // The dashboard's Inbox page says it beside the source.
    let page = inbox_page(&app).await;
    let row = page
        .split("<td data-label=\"Source\">stripe</td>")
        .nth(1)
        .and_then(|rest| rest.split("</tr>").next())
        .unwrap_or_else(|| panic!("a reconciliation row for stripe: {page}"));
    assert!(
        row.contains("stripe refused the API key of source"),
        "{row}"
    );

    // The command says the same, and fails.
    let output = crate::inbox_reconcile_cli::cli(
        &app,
        &log.base_url(),
        &["inbox", "reconcile", "--source", "stripe"],
    );
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("stripe refused the API key of source \"stripe\""),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_or_failing_log_is_asked_again_and_the_run_completes() {
    let app = spawn_app().await;
    let log = log_and_source(&app).await;
    let order = place(&app).await;
    log.add(payment_succeeded(
        "evt_1",
        now(),
        order,
        TOTAL,
        "eur",
        "pi_1",
    ));
    log.answer_next(429, Some(1));
    log.answer_next(500, None);
    let started = Instant::now();

    let report = reconciler(&app, &log, quick())
        .source("stripe", None)
        .await
        .expect("retried until it answered");

    assert_eq!(counts(&report), (1, 1, 0, 1));
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After was honoured"
    );
    let statuses: Vec<u16> = log.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [429, 500, 200]);
    assert_eq!(order_status(&app, order), "paid");

    // Down for longer than the policy tries: an error, nothing half-applied.
    let later = place(&app).await;
    log.add(payment_succeeded(
        "evt_2",
        now(),
        later,
        TOTAL,
        "eur",
        "pi_2",
    ));
    for _ in 0..2 {
        log.answer_next(503, None);
    }
    let two_tries = RetryPolicy {
        attempts: 2,
        ..quick()
    };
    let error = reconciler(&app, &log, two_tries)
        .source("stripe", Some(Duration::from_secs(3600)))
        .await
        .expect_err("unavailable");
    assert!(
        error
            .to_string()
            .contains("unavailable to source \"stripe\" after 2 tries"),
        "{error}"
    );
    assert_eq!(order_status(&app, later), "placed");
}

/// The dashboard's Inbox page, as an operator sees it.
pub(crate) async fn inbox_page(app: &TestApp) -> String {
    let client = crate::admin::raw_client();
    let (cookie, _) = crate::admin::http_login(&client, app, crate::admin::OPERATOR).await;
    client
        .get(app.url("/admin/inbox"))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("GET /admin/inbox")
        .text()
        .await
        .expect("page")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_event_of_the_other_mode_is_stored_ignored_as_a_webhook_would_be() {
    let app = spawn_app().await;
    let log = StripeEventLog::start(API_KEY).await.expect("the event log");
    source::add_with_api_key(
        &mut app.db.conn(),
        "stripe",
        SourceKind::Stripe,
        SourceMode::Test,
        STRIPE_SECRET,
        Some(API_KEY),
        &Keyring::none(),
    )
    .expect("add source");
    let order = place(&app).await;
    let mut live = payment_succeeded("evt_live", now(), order, TOTAL, "eur", "pi_live");
    live["livemode"] = json!(true);
    log.add(live);

    let report = reconciler(&app, &log, quick())
        .source("stripe", None)
        .await
        .expect("reconciled");

    assert_eq!(counts(&report), (1, 1, 0, 1));
    let (status, reason) = stored(&app, "evt_live");
    assert_eq!(status, "ignored");
    assert!(
        reason.is_some_and(|r| r.contains("livemode true")),
        "the reason names the mode"
    );
    assert_eq!(order_status(&app, order), "placed");
}
