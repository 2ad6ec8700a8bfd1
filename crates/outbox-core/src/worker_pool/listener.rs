//! LISTEN/NOTIFY wake-ups on a dedicated connection.
//!
//! Diesel's notification API does not wait on the socket, so the listener uses
//! tokio-postgres, which does: a NOTIFY reaches the producer within a round trip
//! instead of at the next poll. The listener only ever wakes the producer; if it
//! is down, the producer's poll interval keeps jobs moving, and the listener
//! reconnects with backoff (backon) on its own.
//!
//! The connection uses `DATABASE_URL`'s TLS settings as libpq reads them for
//! the pool (see [`tls`]): a server that demands TLS would otherwise refuse the
//! listener and leave the worker pool on its poll interval without anyone noticing.
//! `outbox_listener_connected` (1 or 0) shows which of the two it is on.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use backon::{BackoffBuilder, ExponentialBuilder};
use futures_util::StreamExt as _;
use tokio::sync::Notify;
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;

use crate::outbox::NOTIFY_CHANNEL;

mod tls;

use self::tls::{Attempts, ListenTarget};

const CONNECTED_GAUGE: &str = "outbox_listener_connected";

/// Runs until `shutdown`, calling `wake.notify_one()` for every NOTIFY whose
/// payload is one of `kinds`.
pub async fn listen_for_jobs(
    database_url: String,
    kinds: Vec<String>,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
) {
    // The gauge binds to whichever metrics recorder is installed now: an
    // application that exports metrics installs its recorder before it
    // starts the worker pool.
    let connected_gauge = metrics::gauge!(CONNECTED_GAUGE);
    connected_gauge.set(0.0);
    let mut reconnect = reconnect_backoff();
    // Log once per outage, not once per failed reconnect.
    let mut outage = false;
    loop {
        let mut connected = false;
        let result = listen_once(
            &database_url,
            &kinds,
            &wake,
            &shutdown,
            &mut connected,
            &connected_gauge,
        )
        .await;
        connected_gauge.set(0.0);
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
            // `{:#}`: the cause chain is the useful part ("error performing TLS
            // handshake" alone does not say which certificate or which mode).
            let error = format!("{error:#}");
            if connected {
                tracing::warn!(%error, "LISTEN connection lost; polling until it is back");
            } else {
                tracing::warn!(%error, "cannot LISTEN; polling until it can");
            }
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
    connected_gauge: &metrics::Gauge,
) -> anyhow::Result<()> {
    let (client, mut connection) = open(database_url).await?;
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
    connected_gauge.set(1.0);
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

/// A connection to `database_url` with its TLS settings as libpq reads them;
/// the caller drives the returned connection. The worker pool's hot path opens its
/// connections here too.
pub async fn open(
    database_url: &str,
) -> anyhow::Result<(
    tokio_postgres::Client,
    tokio_postgres::Connection<tokio_postgres::Socket, TlsStream>,
)> {
    let target = ListenTarget::parse(database_url, &|name| std::env::var(name).ok())
        .context("reading DATABASE_URL's TLS settings")?;
    connect(&target)
        .await
        .with_context(|| format!("connecting with sslmode={}", target.mode))
}

pub type TlsStream =
    <tokio_postgres_rustls::MakeRustlsConnect as tokio_postgres::tls::MakeTlsConnect<
        tokio_postgres::Socket,
    >>::Stream;

/// Connects as libpq would for `target.mode`: `prefer` falls back to plain when
/// TLS itself fails, `allow` tries plain first.
async fn connect(
    target: &ListenTarget,
) -> anyhow::Result<(
    tokio_postgres::Client,
    tokio_postgres::Connection<tokio_postgres::Socket, TlsStream>,
)> {
    use tokio_postgres::config::SslMode;
    let tls = target.connector()?;
    let attempt = |mode: SslMode| {
        let tls = tls.clone();
        async move {
            target
                .config(mode)
                .connect(tls)
                .await
                .with_context(|| match mode {
                    SslMode::Disable => "without TLS",
                    SslMode::Prefer => "with TLS if the server offers it",
                    _ => "with TLS",
                })
        }
    };
    match target.attempts {
        Attempts::PlainOnly => attempt(SslMode::Disable).await,
        Attempts::TlsOnly => attempt(SslMode::Require).await,
        // tokio-postgres's own `prefer` goes on in plain when the server has no
        // TLS; a handshake that fails is retried in plain here, as libpq does.
        Attempts::TlsThenPlain => match attempt(SslMode::Prefer).await {
            Err(error) if tls::is_tls_failure(error.as_ref()) => {
                tracing::debug!(
                    error = format!("{error:#}"),
                    "TLS failed; sslmode=prefer tries without"
                );
                attempt(SslMode::Disable)
                    .await
                    .with_context(|| format!("after TLS failed ({error:#})"))
            }
            other => other,
        },
        Attempts::PlainThenTls => match attempt(SslMode::Disable).await {
            Err(error) => attempt(SslMode::Require)
                .await
                .with_context(|| format!("after plain failed ({error:#})")),
            ok => ok,
        },
    }
}
