//! The order HTTP API (docs/api.md), on axum.
//!
//! - [`auth`]: the key and the scope each `/orders` route needs, checked in
//!   one place before the body is read (401, 403, the per-key 429 of
//!   [`api_key_limit`]);
//! - `address_limit`: the per-address limit before authentication;
//! - `openapi`: `GET /openapi.json`, generated from the handlers;
//! - `orders`: `POST /orders`, `GET /orders/{id}`, `GET /orders/{id}/receipt.pdf`;
//! - `effects`: `GET /orders/{id}/effects`, the order's effect ledger;
//! - `receipt_link`: the signed customer link to a receipt, and its refusal page;
//! - `body`: reading a JSON body by hand, so every rejection is a JSON error;
//! - [`error`]: [`ApiError`], the one error of every handler, and the one place
//!   that maps it to a status and a body;
//! - `inbound`: `POST /inbound/{source}`, a payment provider's signed
//!   webhook, authenticated by its signature (no API key);
//! - `ops`: `GET /healthz`, unknown routes and methods; `health`: the
//!   background check `/healthz` reads (metrics are on `METRICS_ADDR`);
//! - `middleware`: the span, the HTTP metrics and the time limit of each request;
//! - `state`: what handlers share, including the gate in front of the pool;
//!
//! The server that mounts these routes beside the dashboard is
//! [`crate::server::Application`].

mod address_limit;
pub mod api_key_limit;
pub mod auth;
mod body;
mod direct;
mod effects;
pub mod error;
mod health;
mod health_check;
mod inbound;
mod key_cache;
mod middleware;
mod openapi;
mod ops;
mod orders;
mod place;
mod receipt_link;
mod state;

pub(crate) use health_check::{check as check_health, run_checks as run_health_checks};
pub(crate) use state::Db;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
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
use crate::client_addr::TrustedProxies;
use crate::db::{self, PgPool, PoolOptions};
use crate::http_server::ConnectionLimits;
use crate::outbox::Waker;
use crate::telemetry::metrics_handle;
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
    /// Deliveries an event's transaction writes itself, at most
    /// (`FANOUT_INLINE`); past it, an `order_fanout` job writes them.
    pub fanout_inline: usize,
    /// How long a new order may stay unpaid before it expires
    /// (`ORDER_PAYMENT_WINDOW`); `None`: it never does. The window in force
    /// at placing is the one stored with the order.
    pub payment_window: Option<Duration>,
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
    pub admin: Option<crate::config::dashboard::AdminSettings>,
    /// Checks the signed receipt links that emails carry (`LINK_SIGNING_KEY`);
    /// `None` only with keys and links turned off.
    pub receipt_links: Option<crate::links::ReceiptLinks>,
    /// Opens the sources' sealed secrets (`SECRETS_KEY`).
    pub secrets: crate::sealed::Keyring,
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
    pub trusted_proxies: TrustedProxies,
    /// How old `/inbound`'s snapshot of the sources may be: a source added
    /// or rotated takes effect within it.
    pub source_cache_ttl: Duration,
}

impl ApiSettings {
    /// How the jobs of the events this API writes are queued.
    pub fn event_jobs(&self) -> crate::orders::EventJobs {
        crate::orders::EventJobs {
            max_attempts: self.max_attempts,
            fanout_inline: self.fanout_inline,
        }
    }
}

impl Default for ApiSettings {
    fn default() -> Self {
        ApiSettings {
            max_attempts: crate::outbox::DEFAULT_MAX_ATTEMPTS,
            fanout_inline: crate::orders::DEFAULT_FANOUT_INLINE,
            payment_window: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            pool_size: DEFAULT_POOL_SIZE,
            db_wait: DEFAULT_DB_WAIT,
            statement_timeout: DEFAULT_STATEMENT_TIMEOUT,
            queue_depth_ttl: DEFAULT_QUEUE_DEPTH_TTL,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            connections: ConnectionLimits::default(),
            admin: None,
            receipt_links: None,
            secrets: crate::sealed::Keyring::none(),
            auth: ApiAuth::Keys,
            rate_limit: None,
            address_limit: DEFAULT_ADDRESS_LIMIT.parse().ok(),
            trusted_proxies: TrustedProxies::default(),
            source_cache_ttl: crate::inbox::source_cache::SOURCE_CACHE_TTL,
        }
    }
}

/// What the API runs on: its pool, and the URL it was built from, which the
/// API's own connections for the key check and the placement open
/// (`direct`). Made by [`connect`].
#[derive(Debug, Clone)]
pub struct ApiDatabase {
    pool: PgPool,
    url: String,
}

impl ApiDatabase {
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The gate the handlers call through: the pool, and beside it
    /// `settings.pool_size` connections of the API's own.
    pub(crate) fn gate(&self, settings: &ApiSettings) -> Db {
        // Past its statement_timeout the server has cancelled a statement
        // and answered; no answer long after that is a dead peer.
        let deadline = settings.statement_timeout + STATEMENT_GRACE;
        let direct = direct::Direct::new(
            self.pool.clone(),
            self.url.clone(),
            settings.pool_size as usize,
            deadline,
        );
        Db::new(self.pool.clone(), direct, settings.db_wait)
    }
}

/// How long past `statement_timeout` a statement on one of the API's own
/// connections may go unanswered before the connection is taken for dead.
const STATEMENT_GRACE: Duration = Duration::from_secs(5);

/// The API's pool: checkout bounded by `db_wait`, statements by
/// `statement_timeout`. r2d2 does not ping its checkouts: the API chooses per
/// call (`Db::run` pings before a write, `Db::read` runs a read at once and
/// again on another connection if it found its own dead), so a request
/// still never fails on a connection that died while idle. The API's own
/// connections open when first needed.
pub fn connect(database_url: &str, settings: &ApiSettings) -> ApiDatabase {
    let pool = db::build_pool(
        database_url,
        &PoolOptions {
            size: settings.pool_size,
            validate_on_checkout: false,
            checkout_timeout: settings.db_wait,
            statement_timeout: Some(settings.statement_timeout),
            ..PoolOptions::default()
        },
    );
    ApiDatabase {
        pool,
        url: database_url.to_owned(),
    }
}

/// The order API's routes (`/orders`, `/healthz`, `/openapi.json`) on `db`,
/// without the layers: [`with_layers`] puts those around everything the
/// server mounts.
pub(crate) fn routes(db: Db, settings: &ApiSettings, waker: Waker) -> Router {
    routes_and_document(db, settings, waker).0
}

/// [`routes`], and the OpenAPI document of them.
fn routes_and_document(
    db: Db,
    settings: &ApiSettings,
    waker: Waker,
) -> (Router, utoipa::openapi::OpenApi) {
    // Installs the recorder before the first request records anything.
    let _ = metrics_handle();
    let state = state::AppState {
        enqueuer: crate::orders::order_enqueuer().wake_after_commit(waker),
        db,
        settings: Arc::new(settings.clone()),
        inbound: Arc::new(crate::inbox::source_cache::InboundGate::new(
            settings.source_cache_ttl,
        )),
    };
    let limiter = settings
        .rate_limit
        .and_then(api_key_limit::RateLimiter::new)
        .map(Arc::new);
    // Only placements let keys in from the cache: their statement checks the
    // key again (key_cache.rs says why that is enough).
    let key_cache = Arc::new(key_cache::KeyCache::default());
    // What each route needs, next to it: checked by auth::authorize before
    // the handler reads anything.
    let needs = |required| {
        axum::middleware::from_fn_with_state(
            auth::Gate {
                auth: settings.auth,
                required,
                db: state.db.clone(),
                limiter: limiter.clone(),
                cache: (required == Required::Scope(Scope::Place)).then(|| Arc::clone(&key_cache)),
            },
            auth::authorize,
        )
    };
    // Every public route through `routes!`, which registers it and its
    // document together (see `openapi`).
    let (public, mut document) = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(
            OpenApiRouter::new()
                .routes(routes!(place::place))
                .route_layer(needs(Required::Scope(Scope::Place))),
        )
        .merge(
            OpenApiRouter::new()
                .routes(routes!(orders::show))
                .route_layer(needs(Required::Scope(Scope::Read))),
        )
        .merge(
            OpenApiRouter::new()
                .routes(routes!(effects::effects))
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
        .merge(
            OpenApiRouter::new()
                .routes(routes!(inbound::inbound))
                .layer(DefaultBodyLimit::max(crate::inbox::MAX_INBOUND_BYTES)),
        )
        .routes(routes!(ops::healthz))
        .routes(routes!(openapi::openapi_json))
        .split_for_parts();
    openapi::add_links(&mut document);
    let served = openapi::Served::new(&document);
    let router = public.layer(axum::Extension(served)).with_state(state);
    (router, document)
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
        // Before anything reads the request: an address that spent its
        // budget costs no key look-up and no body.
        .layer(axum::middleware::from_fn_with_state(
            address_limit::AddressGate {
                limiter: settings
                    .address_limit
                    .map(|limit| Arc::new(address_limit::AddressLimiter::new(limit))),
                trusted_proxies: settings.trusted_proxies.clone(),
            },
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
    fn every_route_the_server_serves_is_in_the_openapi_document_but_the_dashboard() {
        let tokens = crate::config::dashboard::parse_admin_tokens(
            Some("op:an-operator-token-long-enough-0123"),
            None,
        )
        .expect("a token");
        let settings = ApiSettings {
            admin: Some(crate::config::dashboard::AdminSettings::new(tokens)),
            ..ApiSettings::default()
        };
        // Never connects: the router is only built.
        let db = connect("postgres://nobody@127.0.0.1:1/nowhere", &settings).gate(&settings);
        let (api, document) = routes_and_document(db.clone(), &settings, Waker::new());
        // As the server mounts it.
        let router = with_layers(
            api.merge(crate::admin::routes(db, settings.admin.as_ref())),
            &settings,
        );

        let served: BTreeSet<String> = served_paths(&router)
            .into_iter()
            .filter(|path| path != "/admin" && !path.starts_with("/admin/"))
            .collect();
        let documented: BTreeSet<String> = document.paths.paths.keys().cloned().collect();
        assert!(served.contains("/orders"), "{served:?}");
        assert_eq!(served, documented, "served and documented paths differ");
    }
}
