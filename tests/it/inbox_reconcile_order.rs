//! Reconciliation applies what it recovers in the order Stripe created it,
//! moves its watermark only over what it read, and asks again for a page
//! whose answer broke off.

use std::time::Duration;

use order_service::inbox::reconcile::state as reconcile_state;
use order_service::inbox::source;
use outbox_dev_tools::demo::sinks::stripe_events::{payment_succeeded, stripe_event};
use serde_json::json;

use crate::inbox::{TOTAL, now, order_status, place, stored};
use crate::inbox_reconcile::{log_and_source, quick, reconciler};
use crate::support::app::spawn_app;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missed_payment_and_its_refund_are_applied_oldest_first() {
    let app = spawn_app().await;
    let log = log_and_source(&app).await;
    let order = place(&app).await;
    // Both missed; the log lists the refund first, as it lists newest first.
    log.add(payment_succeeded(
        "evt_pay",
        now() - 120,
        order,
        TOTAL,
        "eur",
        "pi_A",
    ));
    log.add(stripe_event(
        "evt_refund",
        "charge.refunded",
        now() - 60,
        json!({"id": "ch_A", "object": "charge", "amount": TOTAL,
               "amount_refunded": TOTAL, "currency": "eur", "payment_intent": "pi_A",
               "refunded": true, "metadata": {"order_id": order.to_string()}}),
    ));

    let report = reconciler(&app, &log, quick())
        .source("stripe", None)
        .await
        .expect("reconciled");

    assert_eq!((report.fetched, report.recovered), (2, 2));
    assert_eq!(stored(&app, "evt_pay").0, "applied");
    assert_eq!(stored(&app, "evt_refund").0, "applied");
    assert_eq!(order_status(&app, order), "refunded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_with_a_short_since_leaves_the_watermark_where_the_next_run_must_begin() {
    let app = spawn_app().await;
    let log = log_and_source(&app).await;
    let first = place(&app).await;
    log.add(payment_succeeded(
        "evt_old",
        now() - 48 * 3600,
        first,
        TOTAL,
        "eur",
        "pi_old",
    ));
    let reconciler = reconciler(&app, &log, quick());
    reconciler.source("stripe", None).await.expect("first run");
    let source_id = source::find(&mut app.db.conn(), "stripe")
        .expect("read")
        .expect("the source")
        .id;
    let watermark = |app: &crate::support::app::TestApp| {
        reconcile_state::watermark(&mut app.db.conn(), source_id).expect("read")
    };
    let after_first = watermark(&app).expect("a watermark");

    // Missed two hours ago, then a run asked for the last hour only.
    let missed = place(&app).await;
    log.add(payment_succeeded(
        "evt_missed",
        now() - 2 * 3600,
        missed,
        TOTAL,
        "eur",
        "pi_missed",
    ));
    let recent = place(&app).await;
    log.add(payment_succeeded(
        "evt_recent",
        now() - 60,
        recent,
        TOTAL,
        "eur",
        "pi_recent",
    ));
    let short = reconciler
        .source("stripe", Some(Duration::from_secs(3600)))
        .await
        .expect("short run");
    assert_eq!((short.fetched, short.recovered), (1, 1));
    assert_eq!(
        watermark(&app),
        Some(after_first),
        "a run that began after the watermark does not move it"
    );
    assert_eq!(order_status(&app, missed), "placed");

    // The next run begins at the watermark and finds what the short one skipped.
    let next = reconciler.source("stripe", None).await.expect("next run");
    assert_eq!(
        (next.recovered, next.already),
        (1, 2),
        "the old and the recent one again"
    );
    assert_eq!(order_status(&app, missed), "paid");
    let moved = watermark(&app);
    assert!(moved > Some(after_first), "{moved:?} after {after_first}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_whose_answer_broke_off_is_asked_again() {
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
    log.answer_next(200, None);

    let report = reconciler(&app, &log, quick())
        .source("stripe", None)
        .await
        .expect("asked again after the broken answer");

    assert_eq!((report.fetched, report.recovered, report.pages), (1, 1, 1));
    assert_eq!(log.requests().len(), 2);
    assert_eq!(order_status(&app, order), "paid");
}
