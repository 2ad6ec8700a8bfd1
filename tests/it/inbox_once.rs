//! A received message's row is written once, complete, in the transaction
//! that applies it: no reader ever sees it half-decided, and two copies
//! received at once leave one applied message and one repeat.

use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use order_service::inbox::source::SourceKind;
use order_service::schema::inbox_messages;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::inbox::{
    STRIPE_SECRET, TOTAL, add_source, event_types, intent_succeeded, now, order_status, place,
    place_cancelled, post_stripe, stripe, stripe_event,
};
use crate::support::app::spawn_app;

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

fn count(conn: &mut PgConnection, sql: &str, message_id: &str) -> i64 {
    diesel::sql_query(sql)
        .bind::<Text, _>(message_id)
        .get_result::<Count>(conn)
        .expect("count")
        .n
}

/// Whether one session waits for a row lock (the order's) and another for
/// an advisory lock (the message's turn).
fn both_wait(conn: &mut PgConnection) -> bool {
    diesel::sql_query(
        "SELECT least(count(*) FILTER (WHERE wait_event = 'advisory'), \
                      count(*) FILTER (WHERE wait_event IN ('transactionid', 'tuple'))) AS n \
         FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .get_result::<Count>(conn)
    .expect("waits")
    .n >= 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_s_row_is_inserted_complete_and_never_updated() {
    let app = spawn_app().await;
    add_source(&app, "stripe", SourceKind::Stripe, STRIPE_SECRET);
    // Any UPDATE of a row fails its transaction, and so its request.
    diesel::sql_query(
        "CREATE FUNCTION refuse_update() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'an inbox row was updated'; END $$",
    )
    .execute(&mut app.db.conn())
    .expect("function");
    diesel::sql_query(
        "CREATE TRIGGER written_once BEFORE UPDATE ON inbox_messages \
         FOR EACH ROW EXECUTE FUNCTION refuse_update()",
    )
    .execute(&mut app.db.conn())
    .expect("trigger");

    let paid = place(&app).await;
    let cancelled = place_cancelled(&app).await;
    let pay = intent_succeeded("evt_once", json!(paid.to_string()), TOTAL, "eur", "pi_o");
    let late = intent_succeeded("evt_late", json!(cancelled), TOTAL, "eur", "pi_l");
    let other = stripe_event("evt_other", "customer.created", json!({"id": "cus_1"}));
    let nobody = intent_succeeded("evt_nobody", json!("987654"), TOTAL, "eur", "pi_n");
    for (body, status) in [
        (&pay, "applied"),
        (&pay, "repeat"),
        (&late, "held"),
        (&other, "ignored"),
        (&nobody, "unmatched"),
    ] {
        assert_eq!(stripe(&app, body).await, status);
    }
    assert_eq!(order_status(&app, paid), "paid");
    assert_eq!(order_status(&app, cancelled), "cancelled");

    type Row = (
        String,
        Option<String>,
        Option<String>,
        Option<Value>,
        String,
    );
    let rows: Vec<Row> = inbox_messages::table
        .order(inbox_messages::id)
        .select((
            inbox_messages::message_id,
            inbox_messages::message_type,
            inbox_messages::status,
            inbox_messages::payload,
            inbox_messages::via,
        ))
        .load(&mut app.db.conn())
        .expect("rows");
    let seen: Vec<(&str, Option<&str>, Option<&str>)> = rows
        .iter()
        .map(|(id, kind, status, _, _)| (id.as_str(), kind.as_deref(), status.as_deref()))
        .collect();
    assert_eq!(
        seen,
        [
            (
                "evt_once",
                Some("payment_intent.succeeded"),
                Some("applied")
            ),
            ("evt_late", Some("payment_intent.succeeded"), Some("held")),
            ("evt_other", Some("customer.created"), Some("ignored")),
            (
                "evt_nobody",
                Some("payment_intent.succeeded"),
                Some("unmatched")
            ),
        ]
    );
    assert!(rows.iter().all(|r| r.3.is_some() && r.4 == "webhook"));
    let undecided = count(
        &mut app.db.conn(),
        "SELECT count(*) AS n FROM inbox_messages WHERE decided_at IS NULL AND message_id <> $1",
        "evt_late",
    );
    assert_eq!(undecided, 0, "only the held message waits for a decision");
    app.stop().await;
}

/// The first copy holds the message's turn while it waits for the order's
/// row (locked here, as a slow cancel would hold it); the second waits for
/// that turn. Meanwhile no reader sees the message at all; once the row is
/// free, one copy is applied and the other is a repeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_copies_at_once_leave_one_applied_message_and_one_repeat() {
    let app = spawn_app().await;
    add_source(&app, "stripe", SourceKind::Stripe, STRIPE_SECRET);
    let id = place(&app).await;
    let body = intent_succeeded("evt_twice", json!(id.to_string()), TOTAL, "eur", "pi_t");

    let mut holder = app.db.conn();
    diesel::sql_query("BEGIN")
        .execute(&mut holder)
        .expect("begin");
    diesel::sql_query("SELECT 1 FROM orders WHERE id = $1 FOR UPDATE")
        .bind::<BigInt, _>(id)
        .execute(&mut holder)
        .expect("lock the order");

    let copies: Vec<_> = (0..2)
        .map(|_| {
            let (client, url, body) =
                (app.client.clone(), app.url("/inbound/stripe"), body.clone());
            tokio::spawn(async move {
                client
                    .post(url)
                    .header("content-type", "application/json")
                    .header(
                        "stripe-signature",
                        order_service::inbox::verify::stripe_signature(STRIPE_SECRET, now(), &body),
                    )
                    .body(body)
                    .send()
                    .await
                    .expect("POST /inbound")
            })
        })
        .collect();

    let mut reader = app.db.conn();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !both_wait(&mut reader) {
        assert!(Instant::now() < deadline, "both copies wait");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        count(
            &mut reader,
            "SELECT count(*) AS n FROM inbox_messages WHERE message_id = $1",
            "evt_twice",
        ),
        0,
        "a message being applied is not seen, not even undecided"
    );
    diesel::sql_query("COMMIT")
        .execute(&mut holder)
        .expect("release the order");

    let mut statuses = Vec::new();
    for copy in copies {
        let response = copy.await.expect("the copy's task");
        assert_eq!(response.status(), StatusCode::OK);
        let answer: Value = response.json().await.expect("JSON");
        statuses.push(answer["status"].as_str().expect("a status").to_owned());
    }
    statuses.sort();
    assert_eq!(statuses, ["applied", "repeat"]);
    assert_eq!(event_types(&app, id), ["order.placed", "order.paid"]);
    assert_eq!(
        count(
            &mut reader,
            "SELECT count(*) AS n FROM inbox_messages WHERE message_id = $1 AND status = 'applied'",
            "evt_twice",
        ),
        1
    );
    // A third copy, later, changes nothing either.
    let again = post_stripe(&app, "stripe", STRIPE_SECRET, now(), &body).await;
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(event_types(&app, id), ["order.placed", "order.paid"]);
    app.stop().await;
}
