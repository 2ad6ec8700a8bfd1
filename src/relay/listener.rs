//! LISTEN/NOTIFY wake-ups on a dedicated connection.
//!
//! Diesel's notification API does not wait on the socket, so the listener uses
//! tokio-postgres, which does: a NOTIFY reaches the producer within a round trip
//! instead of at the next poll. The listener only ever wakes the producer; if it
//! is down, the producer's poll interval keeps jobs moving, and the listener
//! reconnects with backoff (backon) on its own.

use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use futures_util::StreamExt as _;
use tokio::sync::Notify;
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;

use crate::outbox::NOTIFY_CHANNEL;

/// Runs until `shutdown`, calling `wake.notify_one()` for every NOTIFY whose
/// payload is one of `kinds`.
pub async fn listen_for_jobs(
    database_url: String,
    kinds: Vec<String>,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let mut reconnect = reconnect_backoff();
    // Log once per outage, not once per failed reconnect.
    let mut outage = false;
    loop {
        let mut connected = false;
        let result = listen_once(&database_url, &kinds, &wake, &shutdown, &mut connected).await;
        if connected {
            reconnect = reconnect_backoff();
            if outage {
                tracing::info!("LISTEN connection restored");
                outage = false;
            }
        }
        let error = match result {
            Ok(()) => return,
            Err(error) => error,
        };
        if !outage {
            tracing::warn!(error = %error, "LISTEN connection lost; polling until it is back");
            outage = true;
        }
        // NOTIFYs sent while we were away are gone: let the producer look now.
        wake.notify_one();
        let delay = reconnect.next().unwrap_or(Duration::from_secs(10));
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

fn reconnect_backoff() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(10))
        .with_jitter()
        .without_max_times()
        .build()
}

/// One connection's life: connect, LISTEN, forward until error or shutdown.
async fn listen_once(
    database_url: &str,
    kinds: &[String],
    wake: &Notify,
    shutdown: &CancellationToken,
    connected: &mut bool,
) -> anyhow::Result<()> {
    let (client, mut connection) =
        tokio_postgres::connect(database_url, tokio_postgres::NoTls).await?;
    let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));

    // The connection must be polled for the LISTEN to complete, so drive both.
    let statement = format!("LISTEN {NOTIFY_CHANNEL}");
    let listen = client.batch_execute(&statement);
    tokio::pin!(listen);
    loop {
        tokio::select! {
            result = &mut listen => { result?; break; }
            message = messages.next() => match message {
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => anyhow::bail!("connection closed before LISTEN completed"),
            },
        }
    }
    *connected = true;
    tracing::debug!(channel = NOTIFY_CHANNEL, "listening for new jobs");
    // Jobs may have arrived while we were not listening.
    wake.notify_one();

    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            message = messages.next() => match message {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if kinds.iter().any(|k| k == n.payload()) {
                        wake.notify_one();
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => anyhow::bail!("LISTEN connection closed"),
            },
        }
    }
}
