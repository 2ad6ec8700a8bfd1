//! One unauthenticated request must not stall the API: `POST
//! /inbound/{source}` with a 256 KiB body, a current timestamp and a
//! `webhook-signature` of thousands of empty `v1,` entries. Checking each
//! entry with a fresh HMAC over the whole body, inside the database gate,
//! would hold one of the 16 connections for seconds of SHA-256, answered
//! 503 (no failure budget spent) at the timeout. Timed on a quiet machine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use order_service::inbox::source::{self, SourceKind, SourceMode};
use reqwest::StatusCode;

use crate::inbox::STANDARD_SECRET;
use crate::support::app::{TestApp, spawn_app};
use crate::support::order_json;

/// The largest body `/inbound` reads.
const BODY_BYTES: usize = 256 * 1024;
/// Concurrent attackers: as many as the API has connections.
const ATTACKERS: usize = 16;

/// A header of `entries` empty `v1,` signatures.
fn empty_signatures(entries: usize) -> String {
    vec!["v1,"; entries].join(" ")
}

/// The attack, with `signature` as its `webhook-signature`: status, body and
/// how long it took; `None` when the server closed the connection instead of
/// answering.
async fn attack(
    client: &reqwest::Client,
    url: &str,
    signature: &str,
) -> (Option<(StatusCode, String)>, Duration) {
    let started = Instant::now();
    let sent = client
        .post(url)
        .header("content-type", "application/json")
        .header("webhook-id", "msg_flood")
        .header(
            "webhook-timestamp",
            chrono::Utc::now().timestamp().to_string(),
        )
        .header("webhook-signature", signature)
        .body(vec![b' '; BODY_BYTES])
        .send()
        .await;
    let answer = match sent {
        Ok(response) => {
            let status = response.status();
            Some((status, response.text().await.unwrap_or_default()))
        }
        Err(_) => None,
    };
    (answer, started.elapsed())
}

async fn timed<F: std::future::Future<Output = StatusCode>>(f: F) -> (StatusCode, Duration) {
    let started = Instant::now();
    let status = f.await;
    (status, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbound_flood_of_signature_entries_is_refused_at_once_and_stalls_no_route() {
    let heavy = crate::support::seats::heavy();
    let _quiet = crate::support::seats::quiet(&heavy);
    let app: TestApp = spawn_app().await;
    source::add(
        &mut app.db.conn(),
        "billing",
        SourceKind::Standard,
        SourceMode::Any,
        STANDARD_SECRET,
        &order_service::sealed::Keyring::none(),
    )
    .expect("add source");
    let url = app.url("/inbound/billing");
    let client = crate::support::app::http_client();

    // The attack at full size: tens of thousands of entries.
    let exact = empty_signatures(40_000);
    let (answer, took) = attack(&client, &url, &exact).await;
    assert!(took < Duration::from_secs(1), "refused after {took:?}");
    if let Some((status, body)) = &answer {
        assert!(
            *status == StatusCode::UNAUTHORIZED
                || *status == StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "{status} {body}"
        );
    }

    // As many entries as a request head the server reads can hold: this one
    // reaches the handler, and is refused by the signature check.
    let fits = empty_signatures(7_000);
    let (answer, took) = attack(&client, &url, &fits).await;
    let (status, body) = answer.expect("an answer");
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(took < Duration::from_secs(1), "refused after {took:?}");

    // 16 attackers sending it back to back; meanwhile /healthz and POST
    // /orders answer in time.
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attackers: Vec<_> = (0..ATTACKERS)
        .map(|_| {
            let (client, url, fits) = (client.clone(), url.clone(), fits.clone());
            let (stop, stopped) = (Arc::clone(&stop), Arc::clone(&stopped));
            tokio::spawn(async move {
                let mut seen = Vec::new();
                while !stopped.load(std::sync::atomic::Ordering::SeqCst) {
                    tokio::select! {
                        answer = attack(&client, &url, &fits) => seen.push(answer),
                        () = stop.notified() => break,
                    }
                }
                seen
            })
        })
        .collect();
    // Let every attacker get its first request in.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for round in 0..8 {
        let (health, took) = timed(async {
            app.client
                .get(app.url("/healthz"))
                .send()
                .await
                .expect("GET /healthz")
                .status()
        })
        .await;
        assert_eq!(health, StatusCode::OK, "round {round}");
        assert!(
            took < Duration::from_millis(1500),
            "/healthz took {took:?} (round {round})"
        );
        let (placed, took) =
            timed(async { app.post_order(&order_json("Ada"), None).await.status() }).await;
        assert_eq!(placed, StatusCode::CREATED, "round {round}");
        assert!(
            took < Duration::from_millis(1500),
            "POST /orders took {took:?} (round {round})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stopped.store(true, std::sync::atomic::Ordering::SeqCst);
    stop.notify_waiters();
    let mut refused = 0;
    for attacker in attackers {
        for (answer, took) in attacker.await.expect("attacker") {
            let (status, body) = answer.expect("an answer");
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
            assert!(took < Duration::from_secs(1), "refused after {took:?}");
            refused += 1;
        }
    }
    assert!(refused >= ATTACKERS, "only {refused} attacks were answered");
    app.stop().await;
}
