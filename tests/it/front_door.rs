//! The listener under abuse: half-open connections are dropped after the
//! header timeout, the connection cap holds without failing anyone for good,
//! and keep-alive connections are recycled.

use std::time::{Duration, Instant};

use outbox_relay::http_server::ConnectionLimits;
use reqwest::StatusCode;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::support::app::{TestApp, spawn_app_with, test_api_settings};
use crate::support::order_json;

const HALF_OPEN: usize = 5000;
/// What a half-open client sends: a request line and one header, never the
/// blank line that ends the head.
const PARTIAL_HEAD: &[u8] = b"POST /orders HTTP/1.1\r\nHost: shop.example\r\n";

async fn spawn_app_limited(limits: ConnectionLimits) -> TestApp {
    let mut settings = test_api_settings();
    settings.connections = limits;
    spawn_app_with(settings).await
}

/// The soft open-files limit of this process, from `/proc/self/limits`.
fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Opens `n` connections that each send [`PARTIAL_HEAD`] and then nothing.
async fn open_half_open(addr: std::net::SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut streams = Vec::with_capacity(n);
    for _ in 0..n {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream
            .write_all(PARTIAL_HEAD)
            .await
            .expect("send a partial head");
        streams.push(stream);
    }
    streams
}

/// Reads until the server closes the connection (EOF or reset).
async fn closed_by_server(mut stream: TcpStream) {
    let mut buf = [0u8; 512];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Posts orders one after another until `stop`; counts 201s and anything else.
fn keep_ordering(app: &TestApp, stop: CancellationToken) -> tokio::task::JoinHandle<(u64, u64)> {
    let client = app.client.clone();
    let url = app.url("/orders");
    tokio::spawn(async move {
        let (mut ok, mut failed) = (0, 0);
        while !stop.is_cancelled() {
            let sent = client
                .post(&url)
                .json(&order_json("Grace Hopper"))
                .timeout(Duration::from_secs(5))
                .send()
                .await;
            match sent {
                Ok(response) if response.status() == StatusCode::CREATED => ok += 1,
                _ => failed += 1,
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (ok, failed)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_connections_are_closed_after_the_header_timeout_while_orders_go_through() {
    let header_timeout = Duration::from_secs(1);
    // Each connection costs this process two descriptors (client and
    // server side); leave room for the other tests running alongside.
    let n = open_files_limit().map_or(HALF_OPEN, |limit| {
        HALF_OPEN.min(limit.saturating_sub(2000) / 2)
    });
    if n < HALF_OPEN {
        eprintln!("open-files limit too low for {HALF_OPEN}: using {n} half-open connections");
    }
    let app = spawn_app_limited(ConnectionLimits {
        header_timeout,
        max_connections: n + 64,
        ..ConnectionLimits::default()
    })
    .await;
    let stop = CancellationToken::new();
    let orders = keep_ordering(&app, stop.clone());

    let opening = Instant::now();
    let streams = open_half_open(app.addr, n).await;
    let opened = Instant::now();
    let all_closed = futures_util::future::join_all(streams.into_iter().map(closed_by_server));
    let margin = Duration::from_secs(5);
    tokio::time::timeout(header_timeout + margin, all_closed)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{n} half-open connections (opened in {:?}) not all closed within {:?}",
                opened - opening,
                header_timeout + margin
            )
        });
    let closed_after = opened.elapsed();
    stop.cancel();
    let (ok, failed) = orders.await.expect("the ordering client");

    assert_eq!(
        failed, 0,
        "an order failed while the server was under abuse"
    );
    assert!(ok >= 5, "only {ok} orders went through");
    eprintln!(
        "{n} half-open connections opened in {:?}, all closed {closed_after:?} after the last; {ok} orders placed meanwhile",
        opened - opening
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_connection_cap_a_new_client_waits_for_a_free_slot_and_is_served() {
    let header_timeout = Duration::from_secs(1);
    let app = spawn_app_limited(ConnectionLimits {
        header_timeout,
        max_connections: 4,
        ..ConnectionLimits::default()
    })
    .await;
    let squatters = open_half_open(app.addr, 4).await;

    let started = Instant::now();
    let response = app.post_order(&order_json("Ada Lovelace"), None).await;
    let waited = started.elapsed();

    assert_eq!(response.status(), StatusCode::CREATED);
    // Served only once the squatters' header timeout freed a slot.
    assert!(
        waited >= header_timeout / 2,
        "served after {waited:?}, before any slot was free"
    );
    for stream in squatters {
        tokio::time::timeout(Duration::from_secs(5), closed_by_server(stream))
            .await
            .expect("a squatter is closed");
    }
    // And the server carries on as usual.
    let again = app.post_order(&order_json("Ada Lovelace"), None).await;
    assert_eq!(again.status(), StatusCode::CREATED);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_connection_is_closed_after_its_request_limit() {
    let app = spawn_app_limited(ConnectionLimits {
        max_requests_per_connection: 3,
        ..ConnectionLimits::default()
    })
    .await;
    let mut stream = TcpStream::connect(app.addr).await.expect("connect");

    for _ in 0..3 {
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: shop.example\r\n\r\n")
            .await
            .expect("send");
    }
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("the server closes the connection after the third answer")
        .expect("read");

    let answer = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    assert_eq!(answer.matches("http/1.1 200 ok").count(), 3, "{answer}");
    assert_eq!(answer.matches("connection: close").count(), 1, "{answer}");
    app.stop().await;
}
