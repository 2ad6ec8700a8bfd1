//! The order workflow through the API (pay, ship, deliver, cancel, and every
//! refusal), and ordered delivery in the outbox core: a key's jobs run one at a
//! time in enqueue order, a failed head blocks only its key, and blocked jobs
//! cost the claim nothing.

use crate::support::enqueue_many;
use std::time::Duration;

use diesel::prelude::*;
use order_service::outbox::{NewJob, blocked_keys};
use order_service::outbox_core::statements::{
    ClaimRequest, ClaimedJob, Finish, Outcome, advance_stranded_keys, claim_jobs, finish_jobs,
};
use order_service::schema::{jobs_all, order_events};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::app::{TestApp, error_of, spawn_app};
use crate::support::{TestDb, make_done, order_json};

async fn act(
    app: &TestApp,
    id: i64,
    action: &str,
    body: Value,
    key: Option<&str>,
) -> reqwest::Response {
    let mut request = app
        .client
        .post(app.url(&format!("/orders/{id}/{action}")))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).expect("body"));
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request.send().await.expect("POST transition")
}

async fn placed(app: &TestApp) -> i64 {
    let response = app.post_order(&order_json("Ада Лавлейс"), None).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    response.json::<Value>().await.expect("order")["id"]
        .as_i64()
        .expect("id")
}

fn events(app: &TestApp, order_id: i64) -> Vec<(i32, String)> {
    order_events::table
        .filter(order_events::order_id.eq(order_id))
        .order(order_events::seq)
        .select((order_events::seq, order_events::event_type))
        .load(&mut app.db.conn())
        .expect("events")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_is_paid_shipped_and_delivered_with_one_event_and_its_jobs_per_step() {
    let app = spawn_app().await;
    let id = placed(&app).await;

    let paid = act(
        &app,
        id,
        "pay",
        json!({"payment_reference": "pi_3Nk"}),
        None,
    )
    .await;
    assert_eq!(paid.status(), StatusCode::OK);
    let paid: Value = paid.json().await.expect("order");
    assert_eq!(paid["status"], "paid");
    assert_eq!(paid["events"][1]["type"], "order.paid");
    assert_eq!(paid["events"][1]["seq"], 2);

    let shipped = act(
        &app,
        id,
        "ship",
        json!({"carrier": "DHL", "tracking_number": "JD014600006281"}),
        None,
    )
    .await;
    assert_eq!(shipped.status(), StatusCode::OK);
    let delivered = act(&app, id, "deliver", json!({}), None).await;
    assert_eq!(delivered.status(), StatusCode::OK);

    let view: Value = app
        .get(&format!("/orders/{id}"))
        .await
        .json()
        .await
        .expect("order");
    assert_eq!(view["status"], "delivered");
    let types: Vec<&str> = view["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["type"].as_str().expect("type"))
        .collect();
    assert_eq!(
        types,
        [
            "order.placed",
            "order.paid",
            "order.shipped",
            "order.delivered"
        ]
    );
    assert_eq!(
        view["events"][2]["data"]["tracking_number"],
        "JD014600006281"
    );
    // Placement: 3 jobs; paid: a webhook; shipped: a webhook and an email;
    // delivered: a webhook.
    let kinds: Vec<(String, Option<String>, bool)> = jobs_all::table
        .filter(jobs_all::order_id.eq(id))
        .order(jobs_all::id)
        .select((jobs_all::kind, jobs_all::ordering_key, jobs_all::blocked))
        .load(&mut app.db.conn())
        .expect("jobs");
    let webhooks = format!("order-{id}-webhooks");
    let emails = format!("order-{id}-emails");
    assert_eq!(
        kinds,
        vec![
            ("confirmation_email".into(), Some(emails.clone()), false),
            ("receipt_pdf".into(), None, false),
            ("order_webhook".into(), Some(webhooks.clone()), false),
            ("order_webhook".into(), Some(webhooks.clone()), true),
            ("order_webhook".into(), Some(webhooks.clone()), true),
            ("order_email".into(), Some(emails), true),
            ("order_webhook".into(), Some(webhooks), true),
        ],
        "each later job waits behind the earlier one of its key"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_transitions_say_why_and_write_nothing() {
    let app = spawn_app().await;
    let id = placed(&app).await;
    let before = (app.rows(), events(&app, id));

    let error = error_of(
        act(&app, id, "deliver", json!({}), None).await,
        StatusCode::CONFLICT,
    )
    .await;
    assert_eq!(error["code"], "invalid_transition");
    let message = error["message"].as_str().expect("message");
    assert!(
        message.contains("placed") && message.contains("delivered"),
        "{message}"
    );

    let error = error_of(
        act(&app, id, "ship", json!({"carrier": "DHL"}), None).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    assert_eq!(error["field"], "tracking_number");
    let error = error_of(
        act(
            &app,
            id,
            "pay",
            json!({"payment_reference": "x", "amount": 3}),
            None,
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    assert_eq!(error["field"], "amount");
    let error = error_of(
        act(&app, id, "cancel", json!({"reason": ""}), None).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    assert_eq!(error["field"], "reason");
    let error = error_of(
        act(
            &app,
            id + 1000,
            "pay",
            json!({"payment_reference": "x"}),
            None,
        )
        .await,
        StatusCode::NOT_FOUND,
    )
    .await;
    assert_eq!(error["code"], "order_not_found");
    let error = error_of(
        act(&app, id, "return", json!({}), None).await,
        StatusCode::NOT_FOUND,
    )
    .await;
    assert_eq!(error["code"], "not_found");
    let wrong_type = app
        .client
        .post(app.url(&format!("/orders/{id}/pay")))
        .header("content-type", "text/plain")
        .body("payment_reference=x")
        .send()
        .await
        .expect("POST");
    assert_eq!(wrong_type.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let malformed = app
        .client
        .post(app.url(&format!("/orders/{id}/pay")))
        .header("content-type", "application/json")
        .body("{\"payment_reference\": ")
        .send()
        .await
        .expect("POST");
    assert_eq!(malformed.status(), StatusCode::BAD_REQUEST);
    assert_eq!((app.rows(), events(&app, id)), before, "nothing written");

    // Cancelled is final; and a shipped order can no longer be cancelled.
    let cancelled = act(&app, id, "cancel", json!({"reason": "out of stock"}), None).await;
    assert_eq!(cancelled.status(), StatusCode::OK);
    let error = error_of(
        act(&app, id, "pay", json!({"payment_reference": "late"}), None).await,
        StatusCode::CONFLICT,
    )
    .await;
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("cancelled"))
    );
    let other = placed(&app).await;
    assert_eq!(
        act(&app, other, "pay", json!({"payment_reference": "p"}), None)
            .await
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        act(
            &app,
            other,
            "ship",
            json!({"carrier": "UPS", "tracking_number": "1Z"}),
            None
        )
        .await
        .status(),
        StatusCode::OK
    );
    let error = error_of(
        act(&app, other, "cancel", json!({"reason": "too late"}), None).await,
        StatusCode::CONFLICT,
    )
    .await;
    assert_eq!(error["code"], "invalid_transition");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_makes_a_transition_safe_to_retry() {
    let app = spawn_app().await;
    let id = placed(&app).await;
    let body = json!({"payment_reference": "pi_1"});
    assert_eq!(
        act(&app, id, "pay", body.clone(), Some("pay-1"))
            .await
            .status(),
        StatusCode::OK
    );
    let again = act(&app, id, "pay", body, Some("pay-1")).await;
    assert_eq!(
        again.status(),
        StatusCode::OK,
        "the same request again: the same answer"
    );
    assert_eq!(events(&app, id).len(), 2, "one paid event");
    let error = error_of(
        act(
            &app,
            id,
            "pay",
            json!({"payment_reference": "pi_2"}),
            Some("pay-1"),
        )
        .await,
        StatusCode::CONFLICT,
    )
    .await;
    assert_eq!(error["code"], "idempotency_conflict");
    app.stop().await;
}

fn keyed(key: &str, n: usize) -> Vec<NewJob> {
    (0..n)
        .map(|i| {
            NewJob::new("noop", json!({ "i": i }))
                .with_options(&order_service::outbox::JobOptions::default().ordering_key(key))
        })
        .collect()
}

fn claim(conn: &mut PgConnection, limit: i64) -> Vec<ClaimedJob> {
    let kinds = vec!["noop".to_owned()];
    claim_jobs(
        conn,
        &ClaimRequest {
            worker_id: "w",
            kinds: &kinds,
            limit,
            lease: Duration::from_secs(60),
        },
    )
    .expect("claim")
}

fn finish(conn: &mut PgConnection, job: &ClaimedJob, outcome: Outcome) {
    let report = finish_jobs(
        conn,
        &[Finish {
            job_id: job.id,
            lease_token: job.lease_token,
            outcome,
        }],
    )
    .expect("finish");
    assert_eq!(report.applied, vec![job.id]);
}

#[test]
fn a_keys_jobs_are_claimed_one_at_a_time_in_enqueue_order_and_a_failed_head_blocks_only_its_key() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let a = enqueue_many(&mut conn, &keyed("a", 3)).expect("enqueue");
    let b = enqueue_many(&mut conn, &keyed("b", 2)).expect("enqueue");
    let free = enqueue_many(&mut conn, &[NewJob::new("noop", json!({}))]).expect("enqueue");

    let first: Vec<i64> = claim(&mut conn, 10).iter().map(|j| j.id).collect();
    assert_eq!(
        first,
        vec![a[0], b[0], free[0]],
        "only each key's head, and the free job"
    );
    assert!(claim(&mut conn, 10).is_empty(), "nothing else is claimable");
    let heads = jobs_all::table
        .filter(jobs_all::id.eq_any([a[0], b[0]]))
        .select((jobs_all::id, jobs_all::lease_token))
        .load::<(i64, Option<i64>)>(&mut conn)
        .expect("heads");
    let head = |id: i64| ClaimedJob {
        id,
        kind: "noop".into(),
        payload: json!({}),
        attempt: 1,
        max_attempts: 8,
        lease_token: heads
            .iter()
            .find(|(h, _)| *h == id)
            .and_then(|(_, t)| *t)
            .expect("token"),
        created_at: chrono::Utc::now(),
        trace_context: None,
        run_after: chrono::Utc::now(),
        concurrency_key: None,
        unfinished_parents: None,
        standalone: false,
    };

    // a's head fails for good: a is blocked; b's head succeeds: b moves on.
    finish(
        &mut conn,
        &head(a[0]),
        Outcome::Failed {
            error: "410 Gone".into(),
        },
    );
    finish(&mut conn, &head(b[0]), Outcome::Done { local: None });
    let next: Vec<ClaimedJob> = claim(&mut conn, 10);
    assert_eq!(next.iter().map(|j| j.id).collect::<Vec<_>>(), vec![b[1]]);
    let blocked = blocked_keys(&mut conn, 10).expect("blocked keys");
    assert_eq!(blocked.len(), 1);
    assert_eq!(
        (
            blocked[0].ordering_key.as_str(),
            blocked[0].job_id,
            blocked[0].waiting
        ),
        ("a", a[0], 2)
    );

    // An operator retries the head; it succeeds; the key resumes in order.
    order_service::outbox::retry_failed_jobs(
        &mut conn,
        &order_service::outbox::RetrySelection::Ids(vec![a[0]]),
    )
    .expect("retry");
    let retried = claim(&mut conn, 10);
    assert_eq!(retried.iter().map(|j| j.id).collect::<Vec<_>>(), vec![a[0]]);
    finish(&mut conn, &retried[0], Outcome::Done { local: None });
    let second = claim(&mut conn, 10);
    assert_eq!(second.iter().map(|j| j.id).collect::<Vec<_>>(), vec![a[1]]);
    // A retry outcome keeps the key held: the head is still unfinished.
    finish(
        &mut conn,
        &second[0],
        Outcome::Retry {
            delay: Duration::ZERO,
            error: "503".into(),
        },
    );
    let again = claim(&mut conn, 10);
    assert_eq!(again.iter().map(|j| j.id).collect::<Vec<_>>(), vec![a[1]]);
    assert!(blocked_keys(&mut conn, 10).expect("blocked").is_empty());
}

#[test]
fn a_job_enqueued_behind_a_running_head_waits_for_it() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let head = enqueue_many(&mut conn, &keyed("k", 1)).expect("enqueue")[0];
    let running = claim(&mut conn, 1).remove(0);
    assert_eq!(running.id, head);
    let late = enqueue_many(&mut conn, &keyed("k", 1)).expect("enqueue")[0];
    assert!(claim(&mut conn, 1).is_empty(), "behind a processing head");
    finish(&mut conn, &running, Outcome::Done { local: None });
    assert_eq!(claim(&mut conn, 1).remove(0).id, late);
}

/// The claim never sees jobs waiting behind a blocked head: its cost does not
/// grow with them.
#[test]
fn the_claim_reads_as_many_buffers_with_ten_thousand_blocked_jobs_as_with_none() {
    let db = TestDb::new();
    let mut conn = db.conn();
    enqueue_many(&mut conn, &keyed("held", 1)).expect("enqueue");
    let head = claim(&mut conn, 1).remove(0);
    finish(
        &mut conn,
        &head,
        Outcome::Failed {
            error: "400".into(),
        },
    );
    diesel::sql_query("ANALYZE jobs")
        .execute(&mut conn)
        .expect("analyze");

    let before = crate::support::claim_buffers(&mut conn, None);
    enqueue_many(&mut conn, &keyed("held", 10_000)).expect("enqueue");
    diesel::sql_query("ANALYZE jobs")
        .execute(&mut conn)
        .expect("analyze");
    let after = crate::support::claim_buffers(&mut conn, None);
    assert!(
        after <= before + 4,
        "claim buffers {before} with no blocked job, {after} with 10,000"
    );
}

#[test]
fn a_key_whose_head_ended_without_advancing_is_advanced_by_the_sweep_and_only_it() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let stranded = enqueue_many(&mut conn, &keyed("stranded", 3)).expect("enqueue");
    let held = enqueue_many(&mut conn, &keyed("held", 2)).expect("enqueue");
    // The head of "stranded" ends done without its successor being released:
    // what a finish whose snapshot missed a concurrent enqueue leaves behind.
    make_done(&mut conn, &format!("id = {}", stranded[0]), "now()");
    // The head of "held" failed: it holds its key, as it should.
    let head = claim(&mut conn, 10);
    assert_eq!(head.iter().map(|j| j.id).collect::<Vec<_>>(), vec![held[0]]);
    finish(
        &mut conn,
        &head[0],
        Outcome::Failed {
            error: "boom".into(),
        },
    );
    assert!(
        claim(&mut conn, 10).is_empty(),
        "nothing claimable before the sweep"
    );

    let released = advance_stranded_keys(&mut conn, 100).expect("sweep");

    assert_eq!(released, vec![stranded[1]]);
    let next = claim(&mut conn, 10);
    assert_eq!(
        next.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![stranded[1]]
    );
    assert!(
        advance_stranded_keys(&mut conn, 100)
            .expect("sweep")
            .is_empty(),
        "a running head keeps its successor blocked; a failed head keeps its key"
    );
}
