//! The accept loop shared by the order API and the relay's metrics port: one
//! place that decides how long a client may take and how many may be connected.
//!
//! `axum::serve` keeps a connection for as long as the client keeps it open,
//! sending nothing. Here:
//!
//! - hyper closes a connection whose request head does not arrive within the
//!   header timeout, which also bounds how long an idle keep-alive connection
//!   is kept;
//! - a response the client does not read fails after the write timeout, so a
//!   client that never reads does not keep its slot;
//! - a connection is told to close after a number of requests, so no client
//!   holds one forever by keeping it busy;
//! - at the connection cap, the connection that has been idle longest (a
//!   half-open one that never finished its request head, or an idle
//!   keep-alive one) is evicted to let the new one in (`registry`). A flood
//!   of half-open connections therefore churns among itself, while a health
//!   probe or a client that sends its request at once is served. Only when
//!   every slot has a request in flight do new clients wait in the kernel's
//!   accept backlog. A cap per client address (on by default) makes one
//!   address give up its own idle connections first, and refuses it when
//!   all of them are busy; loopback and the trusted proxies, whose address
//!   every client behind them shares, are not capped;
//! - a request head (request line and headers) over [`MAX_HEAD_BYTES`] is
//!   answered 431 before any handler runs, and hyper's read buffer holds
//!   little more than that, where its default would hold about 400 KiB per
//!   connection.

mod deadline;
mod registry;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse as _, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use self::deadline::{GuardedBody, WriteDeadline};
use self::registry::{Admission, Connection, Registry};
use crate::client_addr::TrustedProxies;
use crate::config::{
    DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
    DEFAULT_MAX_REQUESTS_PER_CONNECTION, DEFAULT_WRITE_TIMEOUT, HttpLimitsArgs,
};

/// The largest request head (request line and headers) served. A provider's
/// webhook or a browser sends a few KiB; 32 KiB is what common proxies accept.
pub const MAX_HEAD_BYTES: usize = 32 * 1024;

/// hyper's read buffer: a head of up to [`MAX_HEAD_BYTES`] and the start of
/// its body. A head that does not fit is answered by hyper itself (431, with
/// no body) and the connection closed; one that fits but is over
/// [`MAX_HEAD_BYTES`] gets the API's JSON 431.
const READ_BUFFER_BYTES: usize = MAX_HEAD_BYTES + 8 * 1024;

/// Descriptors kept free for everything a process needs besides its clients:
/// database connections, outgoing webhook and SMTP connections, files, logs.
pub const RESERVED_DESCRIPTORS: usize = 256;

/// What one client may hold, and for how long.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Longest wait for a request's head (request line and headers), from when
    /// the connection opens or falls idle after a response. A half-open or
    /// idle keep-alive connection is closed past it.
    pub header_timeout: Duration,
    /// Longest a write of a response may wait for the client to take a
    /// byte; past it the connection is closed.
    pub write_timeout: Duration,
    /// Connections open at once at most; past it, the longest-idle one is
    /// evicted for a new one, or, when none is idle, new ones wait in the
    /// backlog.
    pub max_connections: usize,
    /// Connections one client address (an IPv6 client: its /64) may hold;
    /// past it that address's own longest-idle connection is evicted, or the
    /// new one is closed at once. 0: no such cap. Loopback and
    /// `trusted_proxies` are never capped: every client behind a proxy shares
    /// its address.
    pub max_connections_per_address: usize,
    /// The proxies in front (`TRUSTED_PROXIES`).
    pub trusted_proxies: TrustedProxies,
    /// Requests served on one connection before it is closed (the last
    /// response carries `Connection: close`).
    pub max_requests_per_connection: u64,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            trusted_proxies: Default::default(),
            max_requests_per_connection: DEFAULT_MAX_REQUESTS_PER_CONNECTION,
        }
    }
}

/// The limits `HTTP_*` set; the trusted proxies are `serve`'s to add.
impl From<&HttpLimitsArgs> for ConnectionLimits {
    fn from(args: &HttpLimitsArgs) -> Self {
        ConnectionLimits {
            header_timeout: args.http_header_timeout,
            write_timeout: args.http_write_timeout,
            max_connections: args.http_max_connections,
            max_connections_per_address: args.http_max_connections_per_address,
            trusted_proxies: TrustedProxies::default(),
            max_requests_per_connection: args.http_max_requests_per_connection,
        }
    }
}

impl ConnectionLimits {
    /// `max_connections`, lowered so that the clients and
    /// [`RESERVED_DESCRIPTORS`] fit in this process's descriptor limit: a
    /// cap above the limit would let clients exhaust it after all.
    pub fn effective_max_connections(&self) -> usize {
        match open_files_limit() {
            Some(limit) => {
                let room = limit.saturating_sub(RESERVED_DESCRIPTORS).max(1);
                if self.max_connections > room {
                    tracing::warn!(
                        configured = self.max_connections,
                        open_files_limit = limit,
                        using = room,
                        "the connection cap does not fit in the descriptor limit; lowering it"
                    );
                    room
                } else {
                    self.max_connections
                }
            }
            None => self.max_connections,
        }
    }
}

/// The soft `RLIMIT_NOFILE`, read from `/proc/self/limits` (Linux); `None`
/// elsewhere or when unlimited.
fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Serves `router` on `listener` within `limits` until `shutdown` is
/// cancelled; then stops accepting, asks every connection to close once its
/// request in flight is answered, and returns when all are closed or `grace`
/// has passed (whatever still runs then is dropped).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
    grace: Duration,
) -> std::io::Result<()> {
    let max_connections = limits.effective_max_connections();
    let registry = Registry::new(
        max_connections,
        limits.max_connections_per_address,
        limits.trusted_proxies.clone(),
    );
    // Cancelled when this function returns, so no connection outlives it.
    let abandon = CancellationToken::new();
    let _abandon_on_return = abandon.clone().drop_guard();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(READ_BUFFER_BYTES)
        .keep_alive(true);
    let http = Arc::new(http);

    'accepting: loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = registry.room() => {}
        }
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors, or a connection reset before it was
                    // accepted: the listener is fine, back off and go on.
                    tracing::warn!(error = %error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // The room seen above may be gone (the idle connection then got its
        // request head): this one waits, unserved, until a slot frees.
        let connection = loop {
            match registry.admit(peer.ip()) {
                Admission::Admitted(connection) => break connection,
                Admission::Refused => {
                    tracing::debug!(%peer, "connection refused: its address holds its cap, all busy");
                    continue 'accepting;
                }
                Admission::Full => tokio::select! {
                    () = shutdown.cancelled() => break 'accepting,
                    () = registry.room() => {}
                },
            }
        };
        // Small requests and answers: send them now rather than batch them.
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(WriteDeadline::new(
            stream,
            limits.write_timeout,
            Some(Arc::clone(&connection)),
        ));
        let service = ConnectionService::new(
            router.clone(),
            limits.max_requests_per_connection,
            peer,
            Arc::clone(&connection),
        );
        let served = http.serve_connection(io, service);
        let (shutdown, abandon) = (shutdown.clone(), abandon.clone());
        tokio::spawn(async move {
            let evicted = connection.evicted.clone();
            let mut served = std::pin::pin!(served);
            let result = tokio::select! {
                result = served.as_mut() => result,
                // Idle (no request in flight, no response being written):
                // closing it loses nothing.
                () = evicted.cancelled() => Ok(()),
                () = shutdown.cancelled() => {
                    served.as_mut().graceful_shutdown();
                    tokio::select! {
                        result = served.as_mut() => result,
                        () = abandon.cancelled() => Ok(()),
                    }
                }
                () = abandon.cancelled() => Ok(()),
            };
            if let Err(error) = result {
                // Timeouts and clients that went away are their business.
                tracing::debug!(error = %error, "connection closed with an error");
            }
            // The slot is given back when the last handle on `connection`
            // (this task's, and the service's inside hyper's connection)
            // drops: when this task ends.
        });
    }

    if registry.evictions() > 0 {
        tracing::info!(
            evicted = registry.evictions(),
            "idle connections evicted at the connection cap while serving"
        );
    }
    // Every connection gone means every request answered.
    let drained = async {
        while registry.open() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    if tokio::time::timeout(grace, drained).await.is_err() {
        tracing::warn!(
            ?grace,
            "in-flight requests did not finish within the grace period; stopping anyway"
        );
    }
    Ok(())
}

/// The size of `request`'s head as sent: `METHOD target HTTP/1.1`, each
/// `name: value`, each line with its CRLF, and the empty line.
fn head_len<B>(request: &hyper::Request<B>) -> usize {
    let target = request
        .uri()
        .path_and_query()
        .map_or(1, |target| target.as_str().len());
    let line = request.method().as_str().len() + 1 + target + " HTTP/1.1\r\n".len();
    let fields: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + 2 + value.len() + 2)
        .sum();
    line + fields + 2
}

/// The router behind one connection, counting its requests.
#[derive(Clone)]
struct ConnectionService {
    router: Router,
    served: Arc<AtomicU64>,
    max_requests: u64,
    /// Handed to handlers as axum's `ConnectInfo` (the login limit counts
    /// per client).
    peer: SocketAddr,
    /// Marked busy from each request's head until its response is sent.
    connection: Arc<Connection>,
}

impl ConnectionService {
    fn new(
        router: Router,
        max_requests: u64,
        peer: SocketAddr,
        connection: Arc<Connection>,
    ) -> Self {
        ConnectionService {
            router,
            served: Arc::new(AtomicU64::new(0)),
            max_requests,
            peer,
            connection,
        }
    }
}

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for ConnectionService {
    type Response = Response;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response, Infallible>> + Send + 'static>,
    >;

    fn call(&self, request: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        use tower_service::Service as _;
        let busy = self.connection.busy();
        let last = self.served.fetch_add(1, Ordering::Relaxed) + 1 >= self.max_requests;
        if head_len(&request) > MAX_HEAD_BYTES {
            // Before the router: no handler, layer or extractor sees it.
            tracing::debug!(peer = %self.peer, "refused: a request head over {MAX_HEAD_BYTES} bytes");
            let mut response = head_too_large();
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return Box::pin(async move {
                Ok(response.map(|body| axum::body::Body::new(GuardedBody::new(body, busy))))
            });
        }
        // A Router is always ready, so it is called without `poll_ready`.
        let mut router = self.router.clone();
        let mut request: Request = request.map(axum::body::Body::new);
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(self.peer));
        Box::pin(async move {
            let mut response = router.call(request).await?;
            if last {
                // hyper closes the connection after a response saying so.
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok(response.map(|body| axum::body::Body::new(GuardedBody::new(body, busy))))
        })
    }
}

/// The 431 of a request head over [`MAX_HEAD_BYTES`], in the API's error
/// shape. Written here, below the API, since no route ever sees the request.
fn head_too_large() -> Response {
    let body = serde_json::json!({
        "error": {
            "code": "header_fields_too_large",
            "message": format!(
                "the request's head (request line and headers) is over the limit of {MAX_HEAD_BYTES} bytes"
            ),
        }
    });
    (
        axum::http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        axum::Json(body),
    )
        .into_response()
}
