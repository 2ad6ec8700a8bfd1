//! What placement's HTTP costs on its own: the bench's load generator posting
//! the same order, with as many clients, to a server in this process that
//! reads the body and answers `201` with a body as long as the API's, and
//! does nothing else. Its CPU per order is the part of the API run's
//! client-side CPU that any HTTP front of the same inserts pays on this
//! machine (the load generator and hyper's server side); the rest of that
//! figure is the API's own work (routing, the key check, parsing, the
//! pool's hops, Diesel).

use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use super::drain::process_cpu_seconds;
use super::orders::{load, place_one};

/// One run of the load generator against the no-work server.
#[derive(Debug, Clone, Copy)]
pub struct HttpFloor {
    pub orders_per_second: f64,
    /// This process's CPU per order: the load generator and the server.
    pub client_us: Option<f64>,
}

/// Runs `clients` loops for `duration` against a server answering every POST
/// with `201` and `answer` (the API's own answer to the same order).
pub async fn measure(
    client: &reqwest::Client,
    clients: usize,
    duration: Duration,
    answer: Bytes,
) -> anyhow::Result<HttpFloor> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}/orders", listener.local_addr()?);
    let app = Router::new().route(
        "/orders",
        post(move |body: Bytes| {
            let answer = answer.clone();
            async move {
                // Read, as the API reads it, then dropped.
                drop(body);
                (
                    StatusCode::CREATED,
                    [("content-type", "application/json")],
                    answer,
                )
            }
        }),
    );
    let stop = CancellationToken::new();
    let server = tokio::spawn({
        let stop = stop.clone();
        async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
        }
    });
    // Warm-up: the client's connections to this server.
    load(client, &endpoint, clients, Duration::from_millis(300)).await;
    let before = process_cpu_seconds(None);
    let run = load(client, &endpoint, clients, duration).await;
    let after = process_cpu_seconds(None);
    stop.cancel();
    let _ = server.await;
    anyhow::ensure!(
        run.errors == 0 && run.ok > 0,
        "the no-work server answered {} of {} requests with an error",
        run.errors,
        run.ok + run.errors
    );
    Ok(HttpFloor {
        orders_per_second: run.rate(),
        client_us: after
            .zip(before)
            .map(|(a, b)| (a - b) * 1e6 / run.ok as f64),
    })
}

/// The API's answer to one order: the bytes the no-work server answers with.
pub async fn api_answer(client: &reqwest::Client, endpoint: &str) -> anyhow::Result<Bytes> {
    Ok(place_one(client, endpoint).await?.bytes().await?)
}
