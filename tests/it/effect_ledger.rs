//! The effect ledger (`GET /orders/{id}/effects`, `orders effects ID`, the
//! dashboard's "Effects"): an order placed, paid and shipped, its jobs run
//! by a relay against a real SMTP sink, webhook receiver and JetStream
//! stream, and each entry held against what those peers actually received
//! and answered; a zombie's late success records nothing.

use std::sync::Arc;
use std::time::Duration;

use diesel::prelude::*;
use order_service::api_keys::Scope;
use order_service::effects::email::{EmailConfig, Mailer};
use order_service::effects::ledger::{EffectAnswer, record_effect, sha256_hex};
use order_service::effects::nats::NatsConnections;
use order_service::effects::receipt::ReceiptSettings;
use order_service::effects::webhook::{DeliveryOptions, WebhookSender};
use order_service::effects::{self, JobHandler};
use order_service::orders::{EffectEntry, EffectLedger, load_ledger};
use order_service::outbox::NewJob;
use order_service::outbox_core::statements::{
    ClaimRequest, ClaimedJob, Finish, Outcome, ReapRequest, claim_jobs, finish_jobs,
    reap_expired_leases,
};
use order_service::schema::{jobs_all, receipts};
use order_service::sealed::Keyring;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::admin::{OPERATOR, admin_settings, http_login, raw_client};
use crate::endpoint_delivery::add_endpoint;
use crate::nats::{NATS_URL, TestStream, shared_nats_answers};
use crate::support::app::{
    TestApp, create_api_key, error_of, http_client_with_key, spawn_app_with, test_receipt_links,
};
use crate::support::http::{Answer, HttpSink};
use crate::support::smtp::SmtpSink;
use crate::support::{
    RunningRelay, TestDb, enqueue, order_json, spawn_relay, test_settings, transition,
};

/// What the webhook receiver answers every delivery with.
const RECEIVER_ANSWER: &str = r#"{"received":true,"by":"ledger-test"}"#;

/// A relay in this process running every kind an order's jobs have.
fn order_relay(db: &TestDb, smtp: &SmtpSink) -> RunningRelay {
    let mailer = Mailer::new(&EmailConfig {
        smtp_url: smtp.url(),
        mail_from: "Ledger Shop <orders@shop.example>".to_owned(),
        public_base_url: "https://shop.example/".to_owned(),
        receipt_links: Some(test_receipt_links()),
    })
    .expect("mailer");
    let sender = WebhookSender::for_endpoints(&DeliveryOptions {
        timeout: Duration::from_secs(30),
        allow_private: true,
        proxy: None,
    })
    .expect("webhook sender");
    let effects: Arc<dyn JobHandler> = Arc::new(effects::workers_with_nats(
        db.pool(8),
        Some(mailer),
        Some(sender),
        ReceiptSettings::default(),
        // The test's JetStream is on loopback: WEBHOOK_ALLOW_PRIVATE.
        NatsConnections::new(None, true),
        Keyring::none(),
    ));
    let settings = test_settings(
        "ledger-relay",
        &[
            "confirmation_email",
            "order_email",
            "receipt_pdf",
            "order_webhook",
            "order_publish",
        ],
    );
    spawn_relay(db, settings, effects)
}

/// The jobs of `order_id` not done yet.
fn unfinished(conn: &mut PgConnection, order_id: i64) -> i64 {
    jobs_all::table
        .filter(jobs_all::order_id.eq(order_id))
        .filter(jobs_all::status.ne("done"))
        .count()
        .get_result(conn)
        .expect("count the order's jobs")
}

/// `(id, kind, status, last_error)` of every job of `order_id`, for a failure's message.
fn job_states(
    conn: &mut PgConnection,
    order_id: i64,
) -> Vec<(i64, String, String, Option<String>)> {
    jobs_all::table
        .filter(jobs_all::order_id.eq(order_id))
        .order(jobs_all::id)
        .select((
            jobs_all::id,
            jobs_all::kind,
            jobs_all::status,
            jobs_all::last_error,
        ))
        .load(conn)
        .expect("the order's jobs")
}

/// `(id, kind, lease_token)` of every job of `order_id`, by id.
fn jobs_of(conn: &mut PgConnection, order_id: i64) -> Vec<(i64, String, Option<i64>)> {
    jobs_all::table
        .filter(jobs_all::order_id.eq(order_id))
        .order(jobs_all::id)
        .select((jobs_all::id, jobs_all::kind, jobs_all::lease_token))
        .load(conn)
        .expect("the order's jobs")
}

async fn get_ledger(app: &TestApp, client: &reqwest::Client, order_id: i64) -> reqwest::Response {
    client
        .get(app.url(&format!("/orders/{order_id}/effects")))
        .send()
        .await
        .expect("GET /orders/{id}/effects")
}

fn of_kind<'a>(ledger: &'a EffectLedger, kind: &str) -> Vec<&'a EffectEntry> {
    ledger.effects.iter().filter(|e| e.kind == kind).collect()
}

/// `outbox-relay orders effects ID [--json]` against `database_url`: its
/// stdout, asserted to have succeeded.
fn cli_effects(database_url: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(["orders", "effects"])
        .args(args)
        .env("DATABASE_URL", database_url)
        .output()
        .expect("run outbox-relay orders effects");
    assert!(
        out.status.success(),
        "orders effects {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_shows_what_the_mail_server_the_receiver_and_the_stream_answered() {
    let app = spawn_app_with(admin_settings()).await;
    let mut conn = app.db.conn();
    let smtp = SmtpSink::start().await;
    // Replies of its own, so the ledger cannot be right by matching a default.
    smtp.answer_data_with([
        "250 2.0.0 Ok: queued as LEDGER-A",
        "250 2.0.0 Ok: queued as LEDGER-B",
    ]);
    let receiver = HttpSink::start([], Answer::status(200).body(RECEIVER_ANSWER)).await;
    add_endpoint(&mut conn, "hooks", &receiver, None, 4);
    let stream = if shared_nats_answers() {
        let stream = TestStream::new(NATS_URL, Duration::from_secs(120)).await;
        crate::nats::add_endpoint(&mut conn, NATS_URL, &stream);
        Some(stream)
    } else {
        None
    };

    // The order is placed with a key that reads only its own orders.
    let own_key = create_api_key(&app.db.url, "shop-front", &[Scope::Place, Scope::ReadOwn]);
    let shop = http_client_with_key(&own_key);
    let placed = shop
        .post(app.url("/orders"))
        .header("content-type", "application/json")
        .body(order_json("Ada Lovelace").to_string())
        .send()
        .await
        .expect("POST /orders");
    assert_eq!(placed.status(), StatusCode::CREATED);
    let order_id = placed.json::<Value>().await.expect("the order")["id"]
        .as_i64()
        .expect("an order id");
    transition(
        &mut conn,
        order_id,
        "pay",
        json!({"payment_reference": "pi_ledger"}),
    );
    transition(
        &mut conn,
        order_id,
        "ship",
        json!({"carrier": "DHL", "tracking_number": "JD0001"}),
    );

    let relay = order_relay(&app.db, &smtp);
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while unfinished(&mut conn, order_id) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the order's jobs did not finish: {:?}",
            job_states(&mut conn, order_id)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    relay.stop().await;

    let response = get_ledger(&app, &shop, order_id).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response
            .headers()
            .get("cache-control")
            .map(|v| v.as_bytes()),
        Some(&b"no-store"[..])
    );
    let api_json: Value = response.json().await.expect("JSON");
    let ledger: EffectLedger = serde_json::from_value(api_json.clone()).expect("a ledger");
    assert_eq!(ledger.order_id, order_id);

    // One entry per job, each with the job's final lease token.
    let jobs = jobs_of(&mut conn, order_id);
    let entries: Vec<(i64, String, Option<i64>)> = ledger
        .effects
        .iter()
        .map(|e| (e.job_id, e.kind.clone(), e.lease_token))
        .collect();
    assert_eq!(entries, jobs);
    for entry in &ledger.effects {
        assert_eq!(entry.status, "done", "{entry:?}");
        assert!(entry.attempts >= 1, "{entry:?}");
        assert!(
            entry.recorded_at.is_some() || entry.kind == "receipt_pdf",
            "{entry:?}"
        );
    }

    // Emails: the Message-ID sent, and the server's reply to that message.
    let mails = smtp.accepted();
    let confirmation = of_kind(&ledger, "confirmation_email");
    let shipping = of_kind(&ledger, "order_email");
    assert_eq!(
        (confirmation.len(), shipping.len(), mails.len()),
        (1, 1, 2),
        "a confirmation and a shipping email"
    );
    for entry in confirmation.into_iter().chain(shipping) {
        let message_id = entry.message_id.as_deref().expect("a message_id");
        let mail = mails
            .iter()
            .find(|m| m.header("Message-ID").as_deref() == Some(message_id))
            .unwrap_or_else(|| panic!("no mail carries {message_id}"));
        assert_eq!(entry.smtp_reply.as_deref(), Some(mail.reply.as_str()));
        assert!(mail.reply.contains("LEDGER-"), "{}", mail.reply);
    }

    // Webhooks: the webhook-id received, the status and the digest of what
    // the receiver answered.
    let requests = receiver.requests();
    let webhooks = of_kind(&ledger, "order_webhook");
    assert_eq!(
        (webhooks.len(), requests.len()),
        (3, 3),
        "placed, paid, shipped"
    );
    for entry in webhooks {
        let webhook_id = entry.webhook_id.as_deref().expect("a webhook_id");
        assert!(
            requests
                .iter()
                .any(|r| r.header("webhook-id") == Some(webhook_id)),
            "the receiver never got {webhook_id}"
        );
        assert_eq!(entry.endpoint.as_deref(), Some("hooks"));
        assert_eq!(entry.status_code, Some(200));
        assert_eq!(
            entry.answer_sha256.as_deref(),
            Some(sha256_hex(RECEIVER_ANSWER.as_bytes()).as_str())
        );
        assert_eq!(entry.stream, None);
    }

    // The receipt: the digest of the PDF stored.
    let pdf: Vec<u8> = receipts::table
        .find(order_id)
        .select(receipts::pdf)
        .first(&mut conn)
        .expect("the stored receipt");
    let receipt = of_kind(&ledger, "receipt_pdf");
    assert_eq!(receipt.len(), 1);
    assert_eq!(receipt[0].pdf_sha256, Some(sha256_hex(&pdf)));

    // Publishes: the stream and the sequence the message holds there.
    if let Some(stream) = &stream {
        let messages = stream.messages().await;
        let publishes = of_kind(&ledger, "order_publish");
        assert_eq!((publishes.len(), messages.len()), (3, 3));
        for entry in publishes {
            let msg_id = entry.webhook_id.as_deref().expect("the Nats-Msg-Id");
            let message = messages
                .iter()
                .find(|m| {
                    m.headers
                        .get("Nats-Msg-Id")
                        .is_some_and(|v| v.to_string() == msg_id)
                })
                .unwrap_or_else(|| panic!("the stream holds no {msg_id}"));
            assert_eq!(entry.stream.as_deref(), Some(stream.name.as_str()));
            assert_eq!(
                entry.stream_seq.and_then(|s| u64::try_from(s).ok()),
                Some(message.sequence)
            );
            assert_eq!(entry.duplicate, Some(false));
        }
    }

    // Another key's shop front reads no more of it than GET /orders/{id}.
    let other_key = create_api_key(&app.db.url, "other-front", &[Scope::Place, Scope::ReadOwn]);
    let other = http_client_with_key(&other_key);
    let order = other
        .get(app.url(&format!("/orders/{order_id}")))
        .send()
        .await
        .expect("GET /orders/{id}");
    let hidden = get_ledger(&app, &other, order_id).await;
    assert_eq!(hidden.status(), order.status());
    error_of(hidden, StatusCode::NOT_FOUND).await;
    let payer = http_client_with_key(&create_api_key(&app.db.url, "payer", &[Scope::Pay]));
    let refused = error_of(
        get_ledger(&app, &payer, order_id).await,
        StatusCode::FORBIDDEN,
    )
    .await;
    assert!(refused.to_string().contains("orders:read"), "{refused}");
    error_of(
        get_ledger(&app, &app.client, 999_999).await,
        StatusCode::NOT_FOUND,
    )
    .await;
    let raw = app
        .client
        .get(app.url("/orders/not-a-number/effects"))
        .send()
        .await
        .expect("GET");
    error_of(raw, StatusCode::NOT_FOUND).await;

    // The CLI prints the same JSON, and a table of the same answers.
    let id = order_id.to_string();
    let cli_json: Value =
        serde_json::from_str(&cli_effects(&app.db.url, &[&id, "--json"])).expect("JSON");
    assert_eq!(cli_json, api_json);
    for (args, code, says) in [
        (["999999"], 1, "order 999999 does not exist"),
        (["abc"], 2, "'abc'"),
        (["0"], 2, "0 is not in 1.."),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
            .args(["orders", "effects"])
            .args(args)
            .env("DATABASE_URL", &app.db.url)
            .output()
            .expect("run outbox-relay orders effects");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let table = cli_effects(&app.db.url, &[&id]);
    assert!(
        table.contains("smtp 250 2.0.0 Ok: queued as LEDGER-"),
        "{table}"
    );
    assert!(table.contains("endpoint hooks; http 200"), "{table}");

    // The dashboard's order page lists the same ledger.
    let client = raw_client();
    let (cookie, _) = http_login(&client, &app, OPERATOR).await;
    let page = client
        .get(app.url(&format!("/admin/orders/{order_id}")))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("GET the order page");
    assert_eq!(page.status(), StatusCode::OK);
    let html = page.text().await.expect("the page");
    assert!(html.contains("<h2 id=\"effects\">Effects</h2>"), "{html}");
    for entry in &ledger.effects {
        assert!(
            html.contains(&format!("href=\"/admin/jobs/{0}\">#{0}</a>", entry.job_id)),
            "job {} on the page",
            entry.job_id
        );
    }
    assert!(html.contains("queued as LEDGER-A"), "{html}");
    assert!(html.contains(&sha256_hex(&pdf)), "{html}");
    app.stop().await;
}

fn claim(conn: &mut PgConnection, worker: &str) -> ClaimedJob {
    let kinds = vec!["noop".to_owned()];
    claim_jobs(
        conn,
        &ClaimRequest {
            worker_id: worker,
            kinds: &kinds,
            limit: 1,
            lease: Duration::from_secs(60),
        },
    )
    .expect("claim")
    .pop()
    .expect("a claimable job")
}

fn answer(reply: &str) -> EffectAnswer {
    EffectAnswer::Email {
        message_id: "<job-1.confirmation@shop.example>".to_owned(),
        smtp_reply: reply.to_owned(),
    }
}

#[test]
fn a_zombies_late_success_records_nothing_and_the_owners_records_its_answer() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let order_id = crate::endpoint_delivery::place(&mut conn);
    // A job of the order, as the service's enqueue writes it (jobs_done
    // takes its order_id from the payload).
    let job = enqueue(
        &mut conn,
        &NewJob::new("noop", json!({ "order_id": order_id })),
    )
    .expect("enqueue");
    diesel::sql_query("UPDATE jobs SET order_id = $1 WHERE id = $2")
        .bind::<diesel::sql_types::BigInt, _>(order_id)
        .bind::<diesel::sql_types::BigInt, _>(job)
        .execute(&mut conn)
        .expect("make it the order's");
    let zombie = claim(&mut conn, "zombie");
    diesel::sql_query(
        "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
    )
    .bind::<diesel::sql_types::BigInt, _>(job)
    .execute(&mut conn)
    .expect("expire the lease");
    reap_expired_leases(&mut conn, &ReapRequest::new(10), |_| Duration::ZERO).expect("reap");
    let owner = claim(&mut conn, "owner");
    assert_eq!(owner.id, job);

    let late = Finish {
        job_id: job,
        lease_token: zombie.lease_token,
        outcome: Outcome::Done {
            local: Some(record_effect(job, answer("250 the zombie's"))),
        },
    };
    assert_eq!(
        finish_jobs(&mut conn, &[late]).expect("finish").lost,
        vec![job]
    );
    let ledger = load_ledger(&mut conn, order_id)
        .expect("read")
        .expect("the order");
    let entry = ledger
        .effects
        .iter()
        .find(|e| e.job_id == job)
        .expect("the job");
    assert_eq!(
        (
            entry.status.as_str(),
            entry.smtp_reply.as_deref(),
            entry.recorded_at
        ),
        ("processing", None, None)
    );

    let current = Finish {
        job_id: job,
        lease_token: owner.lease_token,
        outcome: Outcome::Done {
            local: Some(record_effect(job, answer("250 the owner's"))),
        },
    };
    assert_eq!(
        finish_jobs(&mut conn, &[current]).expect("finish").applied,
        vec![job]
    );
    let ledger = load_ledger(&mut conn, order_id)
        .expect("read")
        .expect("the order");
    let entry = ledger
        .effects
        .iter()
        .find(|e| e.job_id == job)
        .expect("the job");
    assert_eq!(entry.status, "done");
    assert_eq!(entry.lease_token, Some(owner.lease_token));
    assert_eq!(entry.smtp_reply.as_deref(), Some("250 the owner's"));
    assert!(entry.recorded_at.is_some());
}
