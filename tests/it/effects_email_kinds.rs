//! Which kind an order's email job has, and which email it sends: the
//! placement queues `confirmation_email`, every later event `order_email`;
//! a `confirmation_email` job queued for a later event (before `order_email`
//! existed) sends that event's email.

use std::sync::Arc;
use std::time::Duration;

use diesel::prelude::*;
use order_service::effects::email::{EmailConfig, Mailer};
use order_service::effects::receipt::ReceiptSettings;
use order_service::effects::{self, JobHandler};
use order_service::orders::{NewOrder, order_enqueuer, place_order};
use order_service::schema::jobs_all;
use serde_json::json;

use crate::support::smtp::{Mail, SmtpSink};
use crate::support::{
    TestDb, init_tracing, order_json, spawn_relay, test_settings, transition, wait_until,
};

/// Runs a relay that sends email for `kinds` (and renders the receipt the
/// confirmation waits for) until a mail with `subject` is accepted; returns it.
async fn mailed(db: &TestDb, kinds: &[&str], subject: &str) -> Mail {
    let sink = SmtpSink::start().await;
    let mailer = Mailer::new(&EmailConfig {
        smtp_url: sink.url(),
        mail_from: "Outbox Shop <orders@shop.example>".to_owned(),
        public_base_url: "https://shop.example/".to_owned(),
        receipt_links: Some(crate::support::app::test_receipt_links()),
    })
    .expect("mailer");
    let effects: Arc<dyn JobHandler> = Arc::new(effects::workers(
        db.pool(4),
        Some(mailer),
        None,
        ReceiptSettings::default(),
    ));
    let mut all = kinds.to_vec();
    all.push("receipt_pdf");
    let relay = spawn_relay(db, test_settings("mail-kinds", &all), effects);
    let find = || {
        sink.accepted()
            .into_iter()
            .find(|m| m.header("Subject").as_deref() == Some(subject))
    };
    wait_until(subject, Duration::from_secs(30), || find().is_some()).await;
    relay.stop().await;
    find().expect("mailed")
}

/// An order placed and moved by `steps` (action, body); its id.
fn moved(conn: &mut PgConnection, steps: &[(&str, serde_json::Value)]) -> i64 {
    init_tracing();
    let order = NewOrder::parse(&order_json("Ada Lovelace")).expect("valid order");
    let order_id = place_order(conn, &order_enqueuer(), &order, None, 8)
        .expect("placed")
        .order_id();
    for (action, body) in steps {
        transition(conn, order_id, action, body.clone());
    }
    order_id
}

/// The order's email jobs, in id order: (id, kind).
fn email_jobs(conn: &mut PgConnection, order_id: i64) -> Vec<(i64, String)> {
    jobs_all::table
        .filter(jobs_all::order_id.eq(order_id))
        .filter(jobs_all::kind.eq_any(["confirmation_email", "order_email"]))
        .order(jobs_all::id)
        .select((jobs_all::id, jobs_all::kind))
        .load(conn)
        .expect("email jobs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shipped_orders_email_is_an_order_email_named_for_the_shipping() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let shipping = json!({"carrier": "DHL", "tracking_number": "JD0001"});
    let paid = json!({"payment_reference": "pi_1"});
    let order_id = moved(&mut conn, &[("pay", paid), ("ship", shipping)]);
    let jobs = email_jobs(&mut conn, order_id);
    let kinds: Vec<&str> = jobs.iter().map(|(_, kind)| kind.as_str()).collect();
    assert_eq!(kinds, ["confirmation_email", "order_email"]);

    let subject = format!("Your order #{order_id} is on its way");
    let mail = mailed(&db, &["confirmation_email", "order_email"], &subject).await;
    assert_eq!(
        mail.header("Message-ID").as_deref(),
        Some(format!("<job-{}.shipped@shop.example>", jobs[1].0).as_str())
    );
    let text = mail.part("text/plain").expect("a text part");
    assert!(text.contains("JD0001"), "the tracking number: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmation_email_queued_for_a_cancellation_still_sends_the_cancellation() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let order_id = moved(&mut conn, &[("cancel", json!({"reason": "out of stock"}))]);
    // As a job queued before order_email existed: the same payload (the
    // order and its event), under the old kind.
    let (job_id, kind) = email_jobs(&mut conn, order_id).pop().expect("an email job");
    assert_eq!(kind, "order_email");
    let retyped = diesel::sql_query("UPDATE jobs SET kind = 'confirmation_email' WHERE id = $1")
        .bind::<diesel::sql_types::BigInt, _>(job_id)
        .execute(&mut conn)
        .expect("retype");
    assert_eq!(retyped, 1);

    // A relay that claims only the old kind sends it.
    let subject = format!("Your order #{order_id} has been cancelled");
    let mail = mailed(&db, &["confirmation_email"], &subject).await;
    assert_eq!(
        mail.header("Message-ID").as_deref(),
        Some(format!("<job-{job_id}.cancelled@shop.example>").as_str())
    );
    let text = mail.part("text/plain").expect("a text part");
    assert!(text.contains("out of stock"), "the reason: {text}");
}
