//! The inbox's retention: what `serve` prunes hourly, what it keeps while an
//! operator has yet to decide it, and what it names on the way out.

use std::io::Write;
use std::sync::{Arc, Mutex};

use diesel::prelude::*;
use order_service::inbox::DEFAULT_RETENTION;
use order_service::inbox::retention::{Pruned, prune_messages};
use order_service::inbox::source::SourceKind;
use order_service::schema::{inbox_messages, jobs_all};
use serde_json::json;

use crate::inbox::{
    STRIPE_SECRET, TOTAL, add_source, cli, event_types, intent_succeeded, order_status, place,
    place_cancelled, stdout_of, stored, stripe,
};
use crate::support::app::{TestApp, spawn_app};

/// Moves a message's `received_at` (and `decided_at`, when it has one) back by `age`.
fn age(app: &TestApp, message_id: &str, age: &str) {
    diesel::sql_query(format!(
        "UPDATE inbox_messages SET received_at = received_at - interval '{age}', \
         decided_at = decided_at - interval '{age}' WHERE message_id = '{message_id}'"
    ))
    .execute(&mut app.db.conn())
    .expect("age");
}

fn kept(app: &TestApp) -> Vec<String> {
    inbox_messages::table
        .order(inbox_messages::message_id)
        .select(inbox_messages::message_id)
        .load(&mut app.db.conn())
        .expect("ids")
}

/// What `serve` runs hourly with INBOX_RETENTION's default.
fn prune(app: &TestApp) -> Pruned {
    prune_messages(&mut app.db.conn(), DEFAULT_RETENTION, 2).expect("prune")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_message_outlives_the_retention_until_an_operator_decides_it() {
    let app = spawn_app().await;
    add_source(&app, "stripe", SourceKind::Stripe, STRIPE_SECRET);
    let cancelled = place_cancelled(&app).await;
    let late = intent_succeeded("evt_late", json!(cancelled), TOTAL, "eur", "pi_late");
    assert_eq!(stripe(&app, &late).await, "held");
    let short = place(&app).await;
    let body = intent_succeeded("evt_short", json!(short), TOTAL - 1, "eur", "pi_short");
    assert_eq!(stripe(&app, &body).await, "held");
    for other in ["evt_other_1", "evt_other_2", "evt_other_3"] {
        let body = crate::inbox::stripe_event(other, "customer.created", json!({}));
        assert_eq!(stripe(&app, &body).await, "ignored");
    }
    for message in [
        "evt_late",
        "evt_short",
        "evt_other_1",
        "evt_other_2",
        "evt_other_3",
    ] {
        age(&app, message, "40 days");
    }

    // In batches of 2, past the held rows among the oldest.
    assert_eq!(prune(&app).messages, 3);
    assert_eq!(
        kept(&app),
        ["evt_late", "evt_short"],
        "a refund needed stays"
    );
    assert_eq!(stored(&app, "evt_late").0, "held");

    // Decided today, a message is kept for the retention from its decision.
    let id: i64 = inbox_messages::table
        .filter(inbox_messages::message_id.eq("evt_short"))
        .select(inbox_messages::id)
        .first(&mut app.db.conn())
        .expect("id");
    stdout_of(&cli(&app.db.url, &["inbox", "apply", &id.to_string()]));
    assert_eq!(prune(&app).messages, 0);
    assert_eq!(kept(&app), ["evt_late", "evt_short"]);
    age(&app, "evt_short", "36 days");
    assert_eq!(prune(&app).messages, 1);
    assert_eq!(kept(&app), ["evt_late"]);
    app.stop().await;
}

/// A `tracing` writer into a buffer the test reads.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log buffer")).into_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pruning_an_unmatched_payment_warns_naming_it() {
    let app = spawn_app().await;
    add_source(&app, "stripe", SourceKind::Stripe, STRIPE_SECRET);
    let nobody = intent_succeeded("evt_nobody", json!("987654"), 4_200, "eur", "pi_nobody");
    assert_eq!(stripe(&app, &nobody).await, "unmatched");
    let other = crate::inbox::stripe_event("evt_other", "customer.created", json!({}));
    assert_eq!(stripe(&app, &other).await, "ignored");
    age(&app, "evt_nobody", "36 days");
    age(&app, "evt_other", "36 days");

    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    let pruned = tracing::subscriber::with_default(subscriber, || prune(&app));
    assert_eq!(
        pruned,
        Pruned {
            messages: 2,
            unmatched_payments: 1
        }
    );
    let text = log.text();
    let warnings: Vec<&str> = text.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 1, "one WARN, for the payment only:\n{text}");
    for words in [
        "money came in for no order",
        "evt_nobody",
        "pi_nobody",
        "4200",
        "EUR",
        "source stripe",
    ] {
        assert!(warnings[0].contains(words), "{words:?} in {}", warnings[0]);
    }
    assert!(kept(&app).is_empty());
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_sent_again_after_its_message_was_pruned_pays_its_order_once() {
    let app = spawn_app().await;
    add_source(&app, "stripe", SourceKind::Stripe, STRIPE_SECRET);
    let id = place(&app).await;
    let body = intent_succeeded("evt_pay", json!(id.to_string()), TOTAL, "eur", "pi_1");
    assert_eq!(stripe(&app, &body).await, "applied");
    let jobs = || -> i64 {
        jobs_all::table
            .filter(jobs_all::order_id.eq(id))
            .count()
            .get_result(&mut app.db.conn())
            .expect("count")
    };
    let jobs_before = jobs();
    age(&app, "evt_pay", "36 days");
    assert_eq!(prune(&app).messages, 1);
    assert!(kept(&app).is_empty(), "its id is forgotten");

    // A resend by hand, past the retention: a new message to the inbox, but
    // its reference already paid the order.
    assert_eq!(stripe(&app, &body).await, "ignored");
    let reason = stored(&app, "evt_pay").1.expect("a reason");
    assert!(reason.contains("already paid by pi_1"), "{reason}");
    assert_eq!(order_status(&app, id), "paid");
    assert_eq!(event_types(&app, id), ["order.placed", "order.paid"]);
    assert_eq!(jobs(), jobs_before, "no second email or delivery");
    app.stop().await;
}
