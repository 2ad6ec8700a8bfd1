//! The receivers of the effects misbehave: the SMTP server goes away and comes
//! back; the webhook receiver answers 5xx, 429 with Retry-After, hangs past
//! the timeout, refuses one call for good, then recovers.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Sinks, jobs_of_kind, place_orders, wait_all_terminal};
use crate::support::http::Answer;
use crate::support::process::BinProcess;
use crate::support::proxy::TcpProxy;
use crate::support::{TestDb, wait_until};

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mail_sent_while_the_smtp_server_is_down_arrives_once_it_is_back_and_none_twice() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let sinks = Sinks::start([], Answer::status(200)).await;
    let proxy = TcpProxy::start(sinks.smtp_addr()).await;
    let (mut relay, _) = BinProcess::start_relay(
        sinks
            .relay("smtp-down", &db.url)
            .env("SMTP_URL", format!("smtp://127.0.0.1:{}", proxy.port())),
    )
    .await;
    // Up: three mails go out, and the relay keeps a pooled SMTP connection.
    place_orders(&mut conn, 3, 30);
    wait_all_terminal(&mut conn, MINUTE).await;
    assert_eq!(sinks.smtp.accepted().len(), 3);

    // Down: connections cut, new ones refused.
    proxy.down().await;
    let before: HashSet<i64> = jobs_of_kind(&mut conn, "confirmation_email")
        .iter()
        .map(|j| j.id)
        .collect();
    place_orders(&mut conn, 5, 30);
    wait_until("every new mail to have failed twice", MINUTE, || {
        jobs_of_kind(&mut conn, "confirmation_email")
            .iter()
            .filter(|j| !before.contains(&j.id))
            .all(|j| j.status == "pending" && j.attempts >= 2 && j.last_error.is_some())
    })
    .await;
    let refused = jobs_of_kind(&mut conn, "confirmation_email")
        .into_iter()
        .filter_map(|j| j.last_error)
        .next()
        .unwrap_or_default();
    assert_eq!(
        sinks.smtp.mails().len(),
        3,
        "nothing got through while down"
    );

    // Back: everything arrives, once.
    proxy.up().await;
    wait_all_terminal(&mut conn, MINUTE).await;
    relay.terminate().await;

    let mails = sinks.smtp.mails();
    assert_eq!(mails.len(), 8, "every mail once: {mails:#?}");
    assert!(mails.iter().all(|m| m.accepted()));
    let ids: HashSet<String> = mails
        .iter()
        .filter_map(|m| m.header("message-id"))
        .collect();
    assert_eq!(ids.len(), 8, "eight distinct Message-IDs");
    let summary = sinks.check(&mut conn);
    assert_eq!((summary.done, summary.failed), (24, 0));
    assert_eq!(summary.repeated_mails, 0);
    eprintln!("while the SMTP server was down, last_error said: {refused}");
}

/// What the receiver answered to the n-th call, as a test label.
fn label(answer: Option<&Answer>) -> String {
    match answer {
        None => "200".to_owned(),
        Some(Answer::Hang(_)) => "hang".to_owned(),
        Some(Answer::Reply { status, .. }) => status.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_receiver_failing_in_every_way_then_recovering_ends_every_job_as_classified() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let script = vec![
        Answer::status(500),
        Answer::status(503).body("down for maintenance"),
        Answer::status(429).header("retry-after", "2"),
        // Past WEBHOOK_TIMEOUT (1s).
        Answer::Hang(Duration::from_secs(3)),
        Answer::status(400).body("order rejected by the receiver"),
        Answer::status(502),
    ];
    let sinks = Sinks::start(script.clone(), Answer::status(200)).await;
    place_orders(&mut conn, 4, 10);
    let (mut relay, _) = BinProcess::start_relay(
        sinks
            .relay("hooks-flaky", &db.url)
            .env("WEBHOOK_TIMEOUT", "1s"),
    )
    .await;
    wait_all_terminal(&mut conn, MINUTE).await;
    relay.terminate().await;

    // The sink answers the n-th call with the n-th scripted answer.
    let mut calls: BTreeMap<String, Vec<(DateTime<Utc>, String)>> = BTreeMap::new();
    for (n, request) in sinks.http.requests().iter().enumerate() {
        calls
            .entry(
                request
                    .header("idempotency-key")
                    .unwrap_or_default()
                    .to_owned(),
            )
            .or_default()
            .push((request.at, label(script.get(n))));
    }
    let retryable = ["500", "503", "429", "hang", "502"];
    let mut failed = 0;
    for job in jobs_of_kind(&mut conn, "order_webhook") {
        let history = calls
            .get(&format!("order-webhook-{}", job.id))
            .unwrap_or_else(|| panic!("no call for {job:?}"));
        let answers: Vec<&str> = history.iter().map(|(_, a)| a.as_str()).collect();
        let (last, earlier) = answers.split_last().expect("at least one call");
        assert!(earlier.iter().all(|a| retryable.contains(a)), "{answers:?}");
        assert_eq!(job.attempts as usize, answers.len(), "{job:?} {answers:?}");
        match *last {
            "200" => assert_eq!(job.status, "done", "{job:?} {answers:?}"),
            "400" => {
                failed += 1;
                assert_eq!(job.status, "failed", "{job:?}");
                let reason = job.last_error.clone().unwrap_or_default();
                assert!(
                    reason.contains("400") && reason.contains("order rejected"),
                    "{reason}"
                );
            }
            other => panic!("{job:?} ended on {other}: {answers:?}"),
        }
        for pair in history.windows(2) {
            let waited = pair[1].0 - pair[0].0;
            match pair[0].1.as_str() {
                "429" => assert!(
                    waited >= chrono::Duration::milliseconds(1900),
                    "Retry-After: 2 honoured, waited {waited}"
                ),
                "hang" => assert!(
                    waited >= chrono::Duration::milliseconds(950),
                    "the timed-out call counted its 1s, waited {waited}"
                ),
                _ => {}
            }
        }
    }
    assert_eq!(failed, 1, "the 400 fails exactly its job");
    let summary = sinks.check(&mut conn);
    assert_eq!((summary.done, summary.failed), (11, 1));
    eprintln!("webhook calls by job: {calls:?}");
}
