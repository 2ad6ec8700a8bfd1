//! The order HTTP API (docs/api.md), on axum.
//!
//! - [`auth`]: the scope each `/orders` route needs, checked in one place
//!   (401, 403, the per-key 429 of [`key_limit`]);
//! - `orders`: `POST /orders`, `GET /orders/{id}`, `GET /orders/{id}/receipt.pdf`;
//! - `receipt_link`: the signed customer link to a receipt, and its refusal page;
//! - `body`: reading a JSON body by hand, so every rejection is a JSON error;
//! - [`error`]: [`ApiError`], the one error of every handler, and the one place
//!   that maps it to a status and a body;
//! - `ops`: `GET /healthz`, `GET /metrics`, unknown routes and methods;
//! - `middleware`: the span, the HTTP metrics and the time limit of each request;
//! - `state`: what handlers share, including the gate in front of the pool;
//!
//! The server that mounts these routes beside the dashboard is
//! [`crate::server::Application`].

pub mod auth;
mod body;
pub mod error;
pub mod key_limit;
mod middleware;
mod ops;
mod orders;
mod receipt_link;
mod state;

pub(crate) use state::Db;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use tower_http::trace::{DefaultOnResponse, TraceLayer};

pub use auth::{ApiAuth, RateLimit};
pub use body::MAX_BODY_BYTES;
pub use error::ApiError;
pub use orders::OrderView;

use crate::api_keys::Scope;
use crate::db::{self, PgPool, PoolOptions};
use crate::http_server::ConnectionLimits;
use crate::outbox::Waker;
use crate::telemetry::{QueueDepthGauge, metrics_handle};
use auth::Required;

pub const DEFAULT_POOL_SIZE: u32 = 16;
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_DB_WAIT: Duration = Duration::from_secs(2);
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_QUEUE_DEPTH_TTL: Duration = Duration::from_secs(5);
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(15);

/// How the API behaves. The timeouts nest: a request waits at most `db_wait`
/// for a connection, each statement runs at most `statement_timeout`, and the
/// whole request at most `request_timeout`. Keeping `statement_timeout` well
/// under `request_timeout` means a write stuck behind a lock is cancelled and
/// rolled back by PostgreSQL (a 503 that wrote nothing) before the request
/// itself would time out.
#[derive(Debug, Clone)]
pub struct ApiSettings {
    /// `max_attempts` of the jobs of new orders (`JOB_MAX_ATTEMPTS`).
    pub max_attempts: i32,
    /// Longest a request may take, body upload included; past it, 503.
    pub request_timeout: Duration,
    /// Connections in the pool built by [`connect`], so database calls in
    /// flight at most, so blocking threads the API occupies at most.
    pub pool_size: u32,
    /// Longest a request waits for a free connection, or for the database to
    /// accept a new one, before it is answered 503.
    pub db_wait: Duration,
    /// `statement_timeout` of the API's connections.
    pub statement_timeout: Duration,
    /// How long `/metrics` reuses its count of jobs by status.
    pub queue_depth_ttl: Duration,
    /// After shutdown is asked for, how long in-flight requests may finish.
    pub shutdown_grace: Duration,
    /// Header timeout, connection cap and keep-alive limits of the listener.
    pub connections: ConnectionLimits,
    /// The dashboard under `/admin`; `None` (or no tokens): `/admin` is 404.
    pub admin: Option<crate::config::dashboard::AdminSettings>,
    /// Checks the signed receipt links that emails carry (`LINK_SIGNING_KEY`);
    /// `None` only with keys and links turned off.
    pub receipt_links: Option<crate::links::ReceiptLinks>,
    /// Whether `/orders` needs an API key (`API_AUTH`).
    pub auth: ApiAuth,
    /// Requests per key at most (`API_RATE_LIMIT`), counted in this process;
    /// `None`: no limit.
    pub rate_limit: Option<RateLimit>,
}

impl Default for ApiSettings {
    fn default() -> Self {
        ApiSettings {
            max_attempts: crate::outbox::DEFAULT_MAX_ATTEMPTS,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            pool_size: DEFAULT_POOL_SIZE,
            db_wait: DEFAULT_DB_WAIT,
            statement_timeout: DEFAULT_STATEMENT_TIMEOUT,
            queue_depth_ttl: DEFAULT_QUEUE_DEPTH_TTL,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            connections: ConnectionLimits::default(),
            admin: None,
            receipt_links: None,
            auth: ApiAuth::Keys,
            rate_limit: None,
        }
    }
}

/// The API's pool: validated on checkout (a request should not fail on a
/// connection that died while idle), checkout bounded by `db_wait`,
/// statements by `statement_timeout`.
pub fn connect(database_url: &str, settings: &ApiSettings) -> PgPool {
    db::build_pool(
        database_url,
        &PoolOptions {
            size: settings.pool_size,
            validate_on_checkout: true,
            checkout_timeout: settings.db_wait,
            statement_timeout: Some(settings.statement_timeout),
            ..PoolOptions::default()
        },
    )
}

/// The order API's routes (`/orders`, `/healthz`, `/metrics`) on `db`, without
/// the layers: [`with_layers`] puts those around everything the server mounts.
pub(crate) fn routes(db: Db, settings: &ApiSettings, waker: Waker) -> Router {
    // Installs the recorder before the first request records anything.
    let _ = metrics_handle();
    let state = state::AppState {
        enqueuer: crate::orders::order_enqueuer().wake_after_commit(waker),
        db,
        queue_depth: Arc::new(QueueDepthGauge::new(settings.queue_depth_ttl)),
        settings: Arc::new(settings.clone()),
        limiter: settings
            .rate_limit
            .and_then(key_limit::RateLimiter::new)
            .map(Arc::new),
    };
    // What each route needs, next to it: checked by auth::authorize and,
    // on the request's connection, by AppState::run_as.
    let needs = |required| {
        axum::middleware::from_fn_with_state(
            auth::Gate {
                auth: settings.auth,
                required,
            },
            auth::authorize,
        )
    };
    // Layers run outside-in in the reverse order of the calls: the span
    // first, so metrics, timeouts and handlers all log inside it; metrics
    // outside the time limit, so a timed-out request is counted as its 503.
    Router::new()
        .route(
            "/orders",
            post(orders::place).route_layer(needs(Required::Scope(Scope::Place))),
        )
        .route(
            "/orders/{id}",
            get(orders::show).route_layer(needs(Required::Scope(Scope::Read))),
        )
        .route(
            "/orders/{id}/receipt.pdf",
            get(orders::receipt).route_layer(needs(Required::Receipt)),
        )
        .route(
            "/orders/{id}/{action}",
            post(orders::transition).route_layer(needs(Required::ActionScope)),
        )
        .route("/healthz", get(ops::healthz))
        .route("/metrics", get(ops::metrics))
        .with_state(state)
}

/// The fallbacks and layers of the public listener, around `routes` (the
/// API's and the dashboard's).
pub(crate) fn with_layers(routes: Router, settings: &ApiSettings) -> Router {
    routes
        .fallback(ops::route_not_found)
        .method_not_allowed_fallback(ops::method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            settings.request_timeout,
            middleware::enforce_timeout,
        ))
        .layer(axum::middleware::from_fn(middleware::record_metrics))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(middleware::request_span)
                .on_response(
                    DefaultOnResponse::new()
                        .level(tracing::Level::INFO)
                        .latency_unit(tower_http::LatencyUnit::Millis),
                )
                // ApiError logs 5xx with their cause; a second line says less.
                .on_failure(()),
        )
}
