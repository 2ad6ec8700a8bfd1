//! The order HTTP API (docs/api.md), on axum.
//!
//! - [`auth`]: the key and the scope each `/orders` route needs, checked in
//!   one place before the body is read (401, 403, the per-key 429 of
//!   [`rate_limit`]);
//! - `address_limit`: the per-address limit before authentication;
//! - `orders`: `POST /orders`, `GET /orders/{id}`, `GET /orders/{id}/receipt.pdf`;
//! - `receipt_link`: the signed customer link to a receipt, and its refusal page;
//! - [`client_addr`]: the client's address, through `TRUSTED_PROXIES`;
//! - `body`: reading a JSON body by hand, so every rejection is a JSON error;
//! - [`error`]: [`ApiError`], the one error of every handler, and the one place
//!   that maps it to a status and a body;
//! - `ops`: `GET /healthz`, unknown routes and methods; `health`: the
//!   background check `/healthz` reads;
//! - `middleware`: the span, the HTTP metrics and the time limit of each request;
//! - `state`: what handlers share, including the gate in front of the pool;
//! - [`admin`]: the operator dashboard under `/admin` (when `ADMIN_TOKEN` is set).
//!
//! Start one with [`Application::build`], then [`Application::run_until_stopped`]:
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use outbox_relay::api::{self, ApiSettings, Application};
//!
//! let settings = ApiSettings::default();
//! let pool = api::connect("postgres://postgres@127.0.0.1/shop", &settings);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let app = Application::build(pool, settings, listener)?;
//! println!("listening on http://{}", app.local_addr());
//! app.run_until_stopped(outbox_relay::shutdown::on_signals()).await
//! # }
//! ```

mod address_limit;
pub mod admin;
pub mod auth;
mod body;
pub mod client_addr;
pub mod error;
mod health;
mod middleware;
mod openapi;
mod ops;
mod orders;
pub mod rate_limit;
mod receipt_link;
mod state;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use tokio_util::sync::CancellationToken;
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use utoipa::OpenApi as _;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use address_limit::DEFAULT_ADDRESS_LIMIT;
pub use auth::{ApiAuth, RateLimit};
pub use body::MAX_BODY_BYTES;
pub use error::ApiError;
pub use orders::OrderView;

use crate::api_keys::Scope;
use crate::db::{self, PgPool, PoolOptions};
use crate::http_server::ConnectionLimits;
use crate::outbox::Waker;
use crate::telemetry::{metrics_handle, run_metrics_upkeep};
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
    /// How long `/metrics` (on the metrics listener) reuses its count of
    /// jobs by status.
    pub queue_depth_ttl: Duration,
    /// After shutdown is asked for, how long in-flight requests may finish.
    pub shutdown_grace: Duration,
    /// Header timeout, connection cap and keep-alive limits of the listener.
    pub connections: ConnectionLimits,
    /// The dashboard under `/admin`; `None` (or no tokens): `/admin` is 404.
    pub admin: Option<admin::AdminSettings>,
    /// Checks the signed receipt links that emails carry (`LINK_SIGNING_KEY`);
    /// `None` only with keys and links turned off.
    pub receipt_links: Option<crate::links::ReceiptLinks>,
    /// Whether `/orders` needs an API key (`API_AUTH`).
    pub auth: ApiAuth,
    /// Requests per key at most (`API_RATE_LIMIT`), counted in this process;
    /// `None`: no limit.
    pub rate_limit: Option<RateLimit>,
    /// Failed or unauthenticated requests per client address at most
    /// (`API_ADDRESS_LIMIT`), before authentication; `None`: no limit.
    pub address_limit: Option<RateLimit>,
    /// The proxies whose `X-Forwarded-For` names the client
    /// (`TRUSTED_PROXIES`).
    pub trusted_proxies: client_addr::TrustedProxies,
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
            address_limit: DEFAULT_ADDRESS_LIMIT.parse().ok(),
            trusted_proxies: client_addr::TrustedProxies::default(),
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

/// The routes and their layers, ready to serve, and the OpenAPI document of
/// the public ones.
fn router(
    settings: ApiSettings,
    db: state::Db,
    waker: Waker,
) -> (Router, utoipa::openapi::OpenApi) {
    // Installs the recorder before the first request records anything.
    let _ = metrics_handle();
    let state = state::AppState {
        enqueuer: crate::orders::order_enqueuer().wake_after_commit(waker),
        db,
        settings: Arc::new(settings.clone()),
    };
    let limiter = settings
        .rate_limit
        .and_then(rate_limit::RateLimiter::new)
        .map(Arc::new);
    let by_address = address_limit::AddressGate {
        limiter: settings
            .address_limit
            .map(|limit| Arc::new(address_limit::AddressLimiter::new(limit))),
        trusted_proxies: settings.trusted_proxies.clone(),
    };
    // What each route needs, next to it: checked by auth::authorize before
    // the handler reads anything.
    let needs = |required| {
        axum::middleware::from_fn_with_state(
            auth::Gate {
                auth: settings.auth,
                required,
                db: state.db.clone(),
                limiter: limiter.clone(),
            },
            auth::authorize,
        )
    };
    // Every public route through `routes!`, which registers it and its
    // document together (see `openapi`).
    let (public, mut document) = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(
            OpenApiRouter::new()
                .routes(routes!(orders::place))
                .route_layer(needs(Required::Scope(Scope::Place))),
        )
        .merge(
            OpenApiRouter::new()
                .routes(routes!(orders::show))
                .route_layer(needs(Required::Scope(Scope::Read))),
        )
        .merge(
            OpenApiRouter::new()
                .routes(routes!(orders::receipt))
                .route_layer(needs(Required::Receipt)),
        )
        .merge(
            OpenApiRouter::new()
                .routes(routes!(orders::transition))
                .route_layer(needs(Required::ActionScope)),
        )
        .routes(routes!(ops::healthz))
        .routes(routes!(openapi::openapi_json))
        .split_for_parts();
    openapi::add_links(&mut document);
    let served = openapi::Served::new(&document);
    // Layers run outside-in in the reverse order of the calls: the span
    // first, so metrics, timeouts and handlers all log inside it; metrics
    // outside the time limit, so a timed-out request is counted as its 503;
    // the address limit before anything reads the request.
    let router = public
        .layer(axum::Extension(served))
        .merge(admin::routes(state.db.clone(), settings.admin.as_ref()))
        .fallback(ops::route_not_found)
        .method_not_allowed_fallback(ops::method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            settings.request_timeout,
            middleware::enforce_timeout,
        ))
        .layer(axum::middleware::from_fn_with_state(
            by_address,
            address_limit::limit_by_address,
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
        .with_state(state);
    (router, document)
}

/// A bound, configured API, ready to run.
#[derive(Debug)]
pub struct Application {
    listener: tokio::net::TcpListener,
    local_addr: SocketAddr,
    router: Router,
    shutdown_grace: Duration,
    connections: ConnectionLimits,
    pool: PgPool,
    db: state::Db,
    waker: Waker,
    /// The listener of `/metrics` (`METRICS_ADDR`), if any.
    metrics: Option<tokio::net::TcpListener>,
    queue_depth_ttl: Duration,
}

impl Application {
    /// Wires the API on `listener` (bind port 0 in tests and read
    /// [`Application::local_addr`]). Nothing runs until `run_until_stopped`.
    pub fn build(
        pool: PgPool,
        settings: ApiSettings,
        listener: tokio::net::TcpListener,
    ) -> std::io::Result<Application> {
        let local_addr = listener.local_addr()?;
        let shutdown_grace = settings.shutdown_grace;
        let connections = settings.connections.clone();
        let waker = Waker::new();
        if settings.auth == ApiAuth::None {
            tracing::warn!(
                "API_AUTH=none: THE ORDER API ACCEPTS EVERY REQUEST WITHOUT A KEY. \
                 Anyone who can reach it can read, pay, ship and cancel every order. \
                 For local development only."
            );
        }
        let db = state::Db::new(pool.clone(), settings.db_wait);
        let queue_depth_ttl = settings.queue_depth_ttl;
        Ok(Application {
            listener,
            local_addr,
            router: router(settings, db.clone(), waker.clone()).0,
            shutdown_grace,
            connections,
            pool,
            db,
            waker,
            metrics: None,
            queue_depth_ttl,
        })
    }

    /// Serves `/metrics` (and the relay's `/healthz`, `/readyz`, `/livez`
    /// shape) on `listener`, apart from the public port (`METRICS_ADDR`).
    pub fn with_metrics(mut self, listener: tokio::net::TcpListener) -> Application {
        self.metrics = Some(listener);
        self
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The metrics listener's address, if [`Application::with_metrics`] gave one.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves until `shutdown` is cancelled, then stops accepting, lets
    /// in-flight requests finish for up to `shutdown_grace`, and returns.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> std::io::Result<()> {
        let upkeep = CancellationToken::new();
        tokio::spawn(run_metrics_upkeep(upkeep.clone()));
        // The first check before the first request, so `/healthz` has an
        // answer from the start; then one a second, whatever the probes.
        health::check(&self.db).await;
        tokio::spawn(health::run_checks(self.db.clone(), upkeep.clone()));
        if let Some(metrics) = self.metrics {
            let addr = metrics.local_addr()?;
            tokio::spawn(crate::telemetry::serve_metrics(
                metrics,
                self.pool.clone(),
                self.connections.clone(),
                Arc::new(std::sync::OnceLock::new()),
                None,
                self.queue_depth_ttl,
                upkeep.clone(),
            ));
            tracing::info!(%addr, "serving the API's /metrics");
        }
        // Stopped after the last request, so it sends that one's wake-up too.
        tokio::spawn(self.waker.run(self.pool, upkeep.clone()));
        tracing::info!(addr = %self.local_addr, "serving the order API");

        let result = crate::http_server::serve(
            self.listener,
            self.router,
            self.connections,
            shutdown,
            self.shutdown_grace,
        )
        .await;
        upkeep.cancel();
        tracing::info!("order API stopped");
        result
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The paths a router serves, read from its `Debug` (axum's only view of
    /// its routes: `path_router: … paths: {RouteId(0): "/orders", …}`); the
    /// fallback router's catch-all after it is not a route.
    fn served_paths(router: &Router) -> BTreeSet<String> {
        let debug = format!("{router:?}");
        let (routes, _fallbacks) = debug
            .split_once("fallback_router")
            .expect("axum's Debug of a Router names its fallback router");
        routes
            .split("RouteId(")
            .skip(1)
            .filter_map(|part| {
                let (_, rest) = part.split_once("): \"")?;
                let (path, _) = rest.split_once('"')?;
                Some(path.to_owned())
            })
            .collect()
    }

    #[test]
    fn every_route_the_router_serves_is_in_the_openapi_document_but_the_dashboard() {
        let settings = ApiSettings {
            admin: Some(admin::AdminSettings::new(
                admin::parse_admin_tokens(Some("op:an-operator-token-long-enough-0123"), None)
                    .expect("a token"),
            )),
            ..ApiSettings::default()
        };
        // Never connects: the router is only built.
        let pool = connect("postgres://nobody@127.0.0.1:1/nowhere", &settings);
        let db = state::Db::new(pool, settings.db_wait);
        let (router, document) = router(settings, db, Waker::new());

        let served: BTreeSet<String> = served_paths(&router)
            .into_iter()
            .filter(|path| path != "/admin" && !path.starts_with("/admin/"))
            .collect();
        let documented: BTreeSet<String> = document.paths.paths.keys().cloned().collect();
        assert!(served.contains("/orders"), "{served:?}");
        assert_eq!(served, documented, "served and documented paths differ");
    }
}
