//! The database goes away under a running relay and API: its connections are
//! killed, or its server restarts. Both processes must recover on their own,
//! the API must answer 503 (JSON) meanwhile rather than hang, and no job may
//! be lost.

use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::Integer;
use outbox_dev_tools::private_pg::PrivatePostgres;
use reqwest::StatusCode;
use serde_json::Value;

use super::{Sinks, wait_all_terminal};
use crate::support::app::{create_api_key, http_client_with_key};
use crate::support::db::{admin_url, terminate_backends};
use crate::support::http::Answer;
use crate::support::process::{BinProcess, Launch};
use crate::support::{TestDb, order_json, wait_until};
use order_service::api_keys::Scope;

const MINUTE: Duration = Duration::from_secs(60);

#[derive(QueryableByName)]
struct Pid {
    #[diesel(sql_type = Integer)]
    pid: i32,
}

/// What one request got: a status and, for errors, the `error.code`.
#[derive(Debug)]
struct Answered {
    status: StatusCode,
    code: Option<String>,
    took: Duration,
}

/// POSTs an order, bounded by 15s: a hang fails the test.
async fn post_order(client: &reqwest::Client, base: &str) -> Answered {
    let started = Instant::now();
    let response = tokio::time::timeout(
        Duration::from_secs(15),
        client
            .post(format!("{base}/orders"))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&order_json("Ada")).expect("JSON"))
            .send(),
    )
    .await
    .expect("the API answers within 15s, it does not hang")
    .expect("POST /orders");
    read(response, started).await
}

async fn get(client: &reqwest::Client, url: &str) -> Answered {
    let started = Instant::now();
    let response = tokio::time::timeout(Duration::from_secs(15), client.get(url).send())
        .await
        .expect("answered within 15s, not a hang")
        .expect("GET");
    read(response, started).await
}

async fn read(response: reqwest::Response, started: Instant) -> Answered {
    let status = response.status();
    let retry_after = response.headers().contains_key("retry-after");
    let body: Value = response
        .json()
        .await
        .expect("a JSON body, whatever the status");
    if status == StatusCode::SERVICE_UNAVAILABLE && body.get("status").is_none() {
        // POST /orders: the error shape, with a Retry-After.
        assert!(retry_after, "a 503 says when to retry: {body}");
    }
    Answered {
        status,
        code: body["error"]["code"].as_str().map(str::to_owned),
        took: started.elapsed(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_killed_under_the_relay_and_the_api_are_replaced_without_a_restart() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let own_pid = diesel::sql_query("SELECT pg_backend_pid() AS pid")
        .get_result::<Pid>(&mut conn)
        .expect("own pid")
        .pid;
    let mut admin = PgConnection::establish(&admin_url()).expect("admin connection");
    let sinks = Sinks::start([], Answer::status(200)).await;
    let (mut api, base) = BinProcess::start_api(Launch::serve("conn-api", &db.url)).await;
    let (mut relay, _) = BinProcess::start_relay(sinks.relay("conn-relay", &db.url)).await;
    let client = http_client_with_key(&create_api_key(&db.url, "conn", &[Scope::All]));
    for _ in 0..5 {
        assert_eq!(post_order(&client, &base).await.status, StatusCode::CREATED);
    }

    let mut answers = Vec::new();
    for _ in 0..3 {
        let killed = terminate_backends(&mut admin, &db.name, own_pid, Duration::ZERO);
        assert!(killed > 0, "the relay and the API hold connections");
        answers.push(post_order(&client, &base).await);
        answers.push(get(&client, &format!("{base}/healthz")).await);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for answer in &answers {
        assert!(
            answer.status.is_success()
                || (answer.status == StatusCode::SERVICE_UNAVAILABLE
                    && answer.code.as_deref() == Some("database_unavailable")),
            "{answer:?}"
        );
    }
    // Recovered: new orders are taken and run.
    for _ in 0..5 {
        assert_eq!(post_order(&client, &base).await.status, StatusCode::CREATED);
    }
    wait_all_terminal(&mut conn, MINUTE).await;

    assert!(api.is_running() && relay.is_running());
    assert!(
        relay.stderr().contains("LISTEN connection lost"),
        "{}",
        relay.stderr()
    );
    api.terminate().await;
    relay.terminate().await;
    let summary = sinks.check(&mut conn);
    assert!(summary.orders >= 8, "{summary:?}");
    assert_eq!(summary.failed, 0, "{summary:?}");
    eprintln!("answers while connections were killed: {answers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_server_restart_is_survived_by_the_relay_and_the_api_without_their_own_restart()
{
    let server = tokio::task::spawn_blocking(PrivatePostgres::start_temporary)
        .await
        .expect("task")
        .expect("a private PostgreSQL for this test");
    let url = server.url();
    // A slow receiver, so that webhooks are in flight when the server stops.
    let sinks = Sinks::start([], Answer::Hang(Duration::from_millis(800))).await;
    let (mut api, base) = BinProcess::start_api(Launch::serve("restart-api", &url)).await;
    let (mut relay, relay_base) = BinProcess::start_relay(sinks.relay("restart-relay", &url)).await;
    // After `serve` started: it migrated the new server.
    let client = http_client_with_key(&create_api_key(&url, "restart", &[Scope::All]));
    for _ in 0..5 {
        assert_eq!(post_order(&client, &base).await.status, StatusCode::CREATED);
    }
    wait_until("a webhook in flight", MINUTE, || {
        !sinks.http.requests().is_empty()
    })
    .await;

    let stopping = tokio::task::spawn_blocking(move || {
        server.stop().expect("stop the server");
        server
    });
    let server = stopping.await.expect("task");
    // Longer than the 2s lease: leases expire while the server is away.
    let outage = Instant::now();
    let mut answers = Vec::new();
    while outage.elapsed() < Duration::from_secs(3) {
        answers.push(post_order(&client, &base).await);
        answers.push(get(&client, &format!("{base}/healthz")).await);
    }
    let relay_health = get(&client, &format!("{relay_base}/healthz")).await;
    for answer in answers.iter().chain([&relay_health]) {
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{answer:?}");
        assert!(answer.took < Duration::from_secs(10), "{answer:?}");
    }
    assert!(
        answers
            .iter()
            .all(|a| a.code.as_deref() == Some("database_unavailable")),
        "{answers:?}"
    );

    let server = tokio::task::spawn_blocking(move || {
        server.start().expect("start the server again");
        server
    })
    .await
    .expect("task");
    let back = Instant::now();
    // The API recovers without a restart: it takes orders again.
    loop {
        let answer = post_order(&client, &base).await;
        if answer.status == StatusCode::CREATED {
            break;
        }
        assert!(
            back.elapsed() < MINUTE,
            "the API did not recover: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for _ in 0..4 {
        assert_eq!(post_order(&client, &base).await.status, StatusCode::CREATED);
    }
    let mut conn = PgConnection::establish(&url).expect("connect after the restart");
    wait_all_terminal(&mut conn, MINUTE).await;

    assert!(api.is_running() && relay.is_running());
    api.terminate().await;
    relay.terminate().await;
    let summary = sinks.check(&mut conn);
    assert_eq!(summary.orders, 10, "{summary:?}");
    assert_eq!(summary.failed, 0, "{summary:?}");
    eprintln!(
        "restart: {} answers during the outage, all 503; the API took orders again {:?} after the start; {summary:?}",
        answers.len(),
        back.elapsed()
    );
    drop(server);
}
