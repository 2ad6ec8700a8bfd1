//! NATS publishes in `delivery_attempts` (and so in `endpoints list` and the
//! dashboard), and NATS endpoints with credentials of their own, against
//! the machine's JetStream and private servers with authorization.

use std::collections::BTreeSet;
use std::process::{Command, Output};
use std::time::Duration;

use async_nats::jetstream;
use diesel::prelude::*;
use order_service::schema::{delivery_attempts, endpoints};
use reqwest::StatusCode;
use serde_json::Value;

use crate::admin::{VIEWER, admin_settings, http_login, raw_client};
use crate::faults::place_orders;
use crate::nats::{
    MINUTE, NATS_URL, PrivateNats, TestStream, add_endpoint, all_done, enqueue_publishes,
    nats_server_installed, pay, publish_jobs, relay, shared_nats_answers,
};
use crate::support::app::spawn_app_with;
use crate::support::process::BinProcess;
use crate::support::{TestDb, wait_until};

/// `(job_id, outcome, stream_sequence, excerpt)` of an endpoint's attempts.
type AttemptRow = (i64, String, Option<i64>, Option<String>);

fn attempts_of(conn: &mut PgConnection, endpoint_id: i64) -> Vec<AttemptRow> {
    delivery_attempts::table
        .filter(delivery_attempts::endpoint_id.eq(endpoint_id))
        .order(delivery_attempts::id)
        .select((
            delivery_attempts::job_id,
            delivery_attempts::outcome,
            delivery_attempts::stream_sequence,
            delivery_attempts::excerpt,
        ))
        .load(conn)
        .expect("attempts")
}

fn endpoints_cmd(db: &TestDb, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .arg("endpoints")
        .args(args)
        .env("DATABASE_URL", &db.url)
        .env("WEBHOOK_ALLOW_PRIVATE", "true")
        .env_remove("NATS_CREDENTIALS")
        .output()
        .expect("run outbox-relay")
}

#[track_caller]
fn assert_ok(output: &Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The row of `name` in `endpoints list --json`.
fn listed(db: &TestDb, name: &str) -> Value {
    let list: Value =
        serde_json::from_str(&assert_ok(&endpoints_cmd(db, &["list", "--json"]))).expect("JSON");
    list.as_array()
        .expect("a list")
        .iter()
        .find(|row| row["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("{name} in {list}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_publish_is_an_attempt_with_its_sequence_counted_in_list_and_dashboard() {
    if !shared_nats_answers() {
        return;
    }
    let app = spawn_app_with(admin_settings()).await;
    let mut conn = app.db.conn();
    let stream = TestStream::new(NATS_URL, Duration::from_secs(120)).await;
    let endpoint = add_endpoint(&mut conn, NATS_URL, &stream);
    let orders = place_orders(&mut conn, 4, 100);
    for &order in &orders {
        pay(&mut conn, order);
    }
    let jobs = enqueue_publishes(&mut conn, endpoint, &orders);
    assert_eq!(jobs, 8, "two events of four orders");

    let (mut relay, _) = BinProcess::start_relay(relay("nats-attempts", &app.db)).await;
    wait_until("every publish done", MINUTE, || all_done(&mut conn)).await;

    let attempts = attempts_of(&mut conn, endpoint);
    let job_ids: BTreeSet<i64> = publish_jobs(&mut conn).iter().map(|j| j.0).collect();
    assert_eq!(
        attempts.len(),
        jobs,
        "one attempt per publish: {attempts:?}"
    );
    assert_eq!(
        attempts.iter().map(|a| a.0).collect::<BTreeSet<_>>(),
        job_ids,
        "each job's attempt"
    );
    assert!(
        attempts.iter().all(|a| a.1 == "ok"),
        "every publish acked: {attempts:?}"
    );
    let sequences: BTreeSet<i64> = attempts.iter().filter_map(|a| a.2).collect();
    let stored: BTreeSet<i64> = stream
        .messages()
        .await
        .iter()
        .map(|m| i64::try_from(m.sequence).expect("a sequence"))
        .collect();
    assert_eq!(
        sequences, stored,
        "each attempt names its message's sequence"
    );
    assert!(
        attempts.iter().all(|a| a
            .3
            .as_deref()
            .is_some_and(|e| e.starts_with("published: sequence"))),
        "{attempts:?}"
    );

    let name = format!("events-{}", stream.prefix);
    let row = listed(&app.db, &name);
    assert_eq!(row["attempts"], 8, "{row}");
    assert_eq!(row["success_rate"], 1.0, "{row}");
    assert!(row["p95_ms"].is_number(), "{row}");
    assert_eq!(row["nats_credentials"], "not set", "{row}");
    let table = assert_ok(&endpoints_cmd(&app.db, &["list"]));
    let line = table
        .lines()
        .find(|l| l.starts_with(&name))
        .unwrap_or_else(|| panic!("{name} in {table}"));
    assert!(line.contains("100.0%"), "{line}");

    let client = raw_client();
    let (cookie, _) = http_login(&client, &app, VIEWER).await;
    let page = client
        .get(app.url("/admin/endpoints"))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("GET /admin/endpoints");
    assert_eq!(page.status(), StatusCode::OK);
    let page = page.text().await.expect("page");
    let start = page.find(&name).expect("the endpoint's row");
    let its_row = &page[start
        ..page[start..]
            .find("</tr>")
            .map_or(page.len(), |e| start + e)];
    assert!(
        its_row.contains(r#"<td data-label="Attempts">8</td>"#),
        "{its_row}"
    );
    assert!(its_row.contains("100.0%"), "{its_row}");
    let detail = client
        .get(app.url(&format!("/admin/endpoints/{endpoint}")))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("GET the endpoint's page");
    assert_eq!(detail.status(), StatusCode::OK);
    let detail = detail.text().await.expect("page");
    for sequence in &sequences {
        assert!(detail.contains(&format!("PubAck {sequence}")), "{detail}");
    }
    assert!(
        detail.contains("not set (NATS_CREDENTIALS, if any)"),
        "{detail}"
    );
    relay.terminate().await;
}

#[tokio::test]
async fn a_publish_to_a_missing_stream_is_a_failed_attempt_saying_so() {
    if !shared_nats_answers() {
        return;
    }
    let db = TestDb::new();
    let mut conn = db.conn();
    let stream = TestStream::new(NATS_URL, Duration::from_secs(120)).await;
    let endpoint = add_endpoint(&mut conn, NATS_URL, &stream);
    let orders = place_orders(&mut conn, 1, 100);
    enqueue_publishes(&mut conn, endpoint, &orders);
    let client = async_nats::connect(NATS_URL).await.expect("connect");
    jetstream::new(client)
        .delete_stream(&stream.name)
        .await
        .expect("delete the stream");

    let (mut relay, _) = BinProcess::start_relay(relay("nats-attempt-failed", &db)).await;
    wait_until("a failed attempt logged", MINUTE, || {
        !attempts_of(&mut conn, endpoint).is_empty()
    })
    .await;
    relay.terminate().await;
    let attempts = attempts_of(&mut conn, endpoint);
    let (job, outcome, sequence, excerpt) = &attempts[0];
    assert_eq!(*job, publish_jobs(&mut conn)[0].0);
    assert_eq!(outcome, "retryable");
    assert_eq!(*sequence, None, "no PubAck, no sequence");
    let excerpt = excerpt.as_deref().unwrap_or_default();
    assert!(
        excerpt.contains(&format!("the stream {} does not exist", stream.name)),
        "{excerpt}"
    );
    let row = listed(&db, &format!("events-{}", stream.prefix));
    assert_eq!(row["success_rate"], 0.0, "{row}");
}

/// A server with one user, JetStream on, and a stream `name` capturing
/// `prefix.>` made with that user's credentials.
async fn stream_on(url: &str, user: &str, password: &str, name: &str, prefix: &str) {
    let client = async_nats::ConnectOptions::with_user_and_password(user.into(), password.into())
        .connect(url)
        .await
        .expect("connect with the server's user");
    jetstream::new(client)
        .create_stream(jetstream::stream::Config {
            name: name.to_owned(),
            subjects: vec![format!("{prefix}.>")],
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .expect("create the stream");
}

fn secret_file(name: &str, content: &str) -> std::path::PathBuf {
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{name}-{:08x}", fastrand::u32(..)));
    std::fs::write(&path, content).expect("write a secret file");
    path
}

#[tokio::test]
async fn each_endpoint_presents_its_own_credentials_to_its_own_server_only() {
    if !nats_server_installed() {
        return;
    }
    // Two servers on free ports, each knowing one user; the relay's
    // NATS_CREDENTIALS is unset, so only the endpoints' own get anyone in.
    let a = PrivateNats::start(&["--user", "alice", "--pass", "a-s3cret"]);
    let b = PrivateNats::start(&["--user", "bob", "--pass", "b-s3cret"]);
    stream_on(&a.url(), "alice", "a-s3cret", "ORDERS_A", "shopa").await;
    stream_on(&b.url(), "bob", "b-s3cret", "ORDERS_B", "shopb").await;
    let db = TestDb::new();
    let mut conn = db.conn();
    let alice = secret_file("alice-pass", "a-s3cret\n");
    let bob = secret_file("bob-pass", "b-s3cret\n");
    let wrong = secret_file("wrong-pass", "not-it\n");
    let add =
        |name: &str, url: &str, stream: &str, prefix: &str, user: &str, file: &std::path::Path| {
            endpoints_cmd(
                &db,
                &[
                    "add",
                    "--name",
                    name,
                    "--url",
                    url,
                    "--allow-http",
                    "--stream",
                    stream,
                    "--subject-prefix",
                    prefix,
                    "--nats-user",
                    user,
                    "--nats-password-file",
                    &file.to_string_lossy(),
                ],
            )
        };

    // Bob's credentials are not alice's server's: refused at once, by name.
    let refused = add("to-a", &a.url(), "ORDERS_A", "shopa", "bob", &bob);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("refused the credentials of the endpoint (user \"bob\")"),
        "{stderr}"
    );
    assert!(!stderr.contains("b-s3cret"), "{stderr}");
    assert_ok(&add("to-a", &a.url(), "ORDERS_A", "shopa", "alice", &alice));
    assert_ok(&add("to-b", &b.url(), "ORDERS_B", "shopb", "bob", &bob));
    // A third endpoint on alice's server whose credentials go wrong after it
    // was added: it must not borrow to-a's connection.
    assert_ok(&add(
        "to-a-wrong",
        &a.url(),
        "ORDERS_A",
        "shopa.w",
        "alice",
        &alice,
    ));
    let stored: Vec<(String, Option<String>)> = endpoints::table
        .order(endpoints::name)
        .select((endpoints::name, endpoints::nats_credentials))
        .load(&mut conn)
        .expect("endpoints");
    assert!(stored.iter().all(|(_, c)| c.is_some()), "{stored:?}");
    let update = endpoints_cmd(
        &db,
        &[
            "update",
            "to-a-wrong",
            "--nats-user",
            "alice",
            "--nats-password-file",
            &wrong.to_string_lossy(),
        ],
    );
    assert_eq!(update.status.code(), Some(2), "checked before it is stored");
    diesel::update(endpoints::table.filter(endpoints::name.eq("to-a-wrong")))
        .set(
            endpoints::nats_credentials
                .eq(r#"{"user_password":{"user":"alice","password":"not-it"}}"#),
        )
        .execute(&mut conn)
        .expect("wrong credentials, as a server's password change leaves them");

    let listed_json = assert_ok(&endpoints_cmd(&db, &["list", "--json"]));
    assert!(
        !listed_json.contains("s3cret") && !listed_json.contains("not-it"),
        "{listed_json}"
    );
    assert_eq!(listed(&db, "to-a")["nats_credentials"], "set");

    let ids: Vec<(String, i64)> = endpoints::table
        .order(endpoints::name)
        .select((endpoints::name, endpoints::id))
        .load(&mut conn)
        .expect("ids");
    let id_of = |name: &str| ids.iter().find(|(n, _)| n == name).map(|(_, id)| *id);
    let orders = place_orders(&mut conn, 2, 100);
    let (mut relay, _) = BinProcess::start_relay(relay("nats-own-credentials", &db)).await;
    let done_for = |conn: &mut PgConnection, endpoint: Option<i64>| -> usize {
        attempts_of(conn, endpoint.expect("the endpoint"))
            .iter()
            .filter(|a| a.1 == "ok")
            .count()
    };
    wait_until("to-a and to-b published every order", MINUTE, || {
        done_for(&mut conn, id_of("to-a")) == orders.len()
            && done_for(&mut conn, id_of("to-b")) == orders.len()
    })
    .await;
    wait_until("to-a-wrong's publish failed saying why", MINUTE, || {
        attempts_of(&mut conn, id_of("to-a-wrong").expect("id"))
            .iter()
            .any(|a| {
                a.3.as_deref()
                    .is_some_and(|e| e.to_lowercase().contains("authorization violation"))
            })
    })
    .await;
    relay.terminate().await;

    let wrong_attempts = attempts_of(&mut conn, id_of("to-a-wrong").expect("id"));
    assert!(
        wrong_attempts.iter().all(|a| a.1 == "retryable"),
        "{wrong_attempts:?}"
    );
    let subjects = |url: String, user: &'static str, password: &'static str, name: &'static str| async move {
        let client =
            async_nats::ConnectOptions::with_user_and_password(user.into(), password.into())
                .connect(url)
                .await
                .expect("connect");
        let mut stream = jetstream::new(client)
            .get_stream(name)
            .await
            .expect("the stream");
        let state = stream.info().await.expect("info").state.clone();
        let mut subjects = BTreeSet::new();
        for seq in state.first_sequence..=state.last_sequence {
            if let Ok(message) = stream.get_raw_message(seq).await {
                subjects.insert(message.subject.to_string());
            }
        }
        subjects
    };
    let on_a = subjects(a.url(), "alice", "a-s3cret", "ORDERS_A").await;
    let on_b = subjects(b.url(), "bob", "b-s3cret", "ORDERS_B").await;
    let expect = |prefix: &str| -> BTreeSet<String> {
        orders
            .iter()
            .map(|o| format!("{prefix}.placed.{o}"))
            .collect()
    };
    assert_eq!(
        on_a,
        expect("shopa"),
        "to-a's only: to-a-wrong got nothing in"
    );
    assert_eq!(on_b, expect("shopb"));
    for path in [alice, bob, wrong] {
        let _ = std::fs::remove_file(path);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_event_to_two_endpoints_is_one_body_published_to_each_and_logged_for_each() {
    if !shared_nats_answers() {
        return;
    }
    let db = TestDb::new();
    let mut conn = db.conn();
    let first = TestStream::new(NATS_URL, Duration::from_secs(120)).await;
    let second = TestStream::new(NATS_URL, Duration::from_secs(120)).await;
    let endpoints = [
        add_endpoint(&mut conn, NATS_URL, &first),
        add_endpoint(&mut conn, NATS_URL, &second),
    ];
    let orders = place_orders(&mut conn, 6, 100);
    assert_eq!(
        publish_jobs(&mut conn).len(),
        12,
        "each event to each endpoint"
    );

    let (mut relay, _) = BinProcess::start_relay(relay("nats-two-endpoints", &db)).await;
    wait_until("every publish done", MINUTE, || all_done(&mut conn)).await;
    relay.terminate().await;

    let bodies = |messages: Vec<async_nats::jetstream::message::StreamMessage>| {
        messages
            .into_iter()
            .map(|m| {
                let order = m.subject.rsplit('.').next().map(str::to_owned);
                (
                    order.expect("the order id ends the subject"),
                    m.payload.to_vec(),
                )
            })
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let (to_first, to_second) = (
        bodies(first.messages().await),
        bodies(second.messages().await),
    );
    assert_eq!(to_first.len(), orders.len());
    assert_eq!(to_first, to_second, "the same bytes to both streams");
    for endpoint in endpoints {
        let attempts = attempts_of(&mut conn, endpoint);
        assert_eq!(attempts.len(), orders.len(), "{attempts:?}");
        assert!(attempts.iter().all(|a| a.1 == "ok"), "{attempts:?}");
    }
}
