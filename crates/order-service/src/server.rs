//! The public HTTP server: the order API ([`crate::api`]) and the operator
//! dashboard ([`crate::admin`]) on one listener, behind one set of layers.
//! Neither knows the other; this is the one place that mounts both.
//!
//! Start one with [`Application::build`], then [`Application::run_until_stopped`]:
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use order_service::api::{self, ApiSettings};
//! use order_service::server::Application;
//!
//! let settings = ApiSettings::default();
//! let database = api::connect("postgres://postgres@127.0.0.1/shop", &settings);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let app = Application::build(database, settings, listener)?;
//! println!("listening on http://{}", app.local_addr());
//! app.run_until_stopped(order_service::shutdown::on_signals()).await
//! # }
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::api::{self, ApiAuth, ApiDatabase, ApiSettings, Db};
use crate::db::PgPool;
use crate::http_server::ConnectionLimits;
use crate::outbox::Waker;
use crate::telemetry::run_metrics_upkeep;

/// The API's routes and the dashboard's on one gate in front of the pool, so
/// both count against the same connections.
fn router(db: Db, settings: &ApiSettings, waker: Waker) -> Router {
    let routes = api::routes(db.clone(), settings, waker)
        .merge(crate::admin::routes(db, settings.admin.as_ref()));
    api::with_layers(routes, settings)
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
    /// The API's gate in front of the pool; its health is what `/healthz` says.
    db: Db,
    waker: Waker,
    /// The listener of `/metrics` (`METRICS_ADDR`), if any.
    metrics: Option<tokio::net::TcpListener>,
    queue_depth_ttl: Duration,
}

impl Application {
    /// Wires the API on `listener` (bind port 0 in tests and read
    /// [`Application::local_addr`]). Nothing runs until `run_until_stopped`.
    pub fn build(
        database: ApiDatabase,
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
        let db = database.gate(&settings);
        let pool = database.pool().clone();
        Ok(Application {
            listener,
            local_addr,
            router: router(db.clone(), &settings, waker.clone()),
            shutdown_grace,
            connections,
            pool,
            db,
            waker,
            metrics: None,
            queue_depth_ttl: settings.queue_depth_ttl,
        })
    }

    /// Serves `/metrics` (with `/healthz`, `/readyz` and `/livez`, as the
    /// relay's sidecar port does) on `listener`, apart from the public port
    /// (`METRICS_ADDR`): metrics tell the business's volume.
    pub fn with_metrics(mut self, listener: tokio::net::TcpListener) -> Application {
        self.metrics = Some(listener);
        self
    }

    /// The metrics listener's address, if [`Application::with_metrics`] gave one.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|l| l.local_addr().ok())
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves until `shutdown` is cancelled, then stops accepting, lets
    /// in-flight requests finish for up to `shutdown_grace`, and returns.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> std::io::Result<()> {
        let upkeep = CancellationToken::new();
        tokio::spawn(run_metrics_upkeep(upkeep.clone()));
        // The first check before the first request, so `/healthz` has an
        // answer from the start; then one a second, whatever the probes.
        api::check_health(&self.db).await;
        tokio::spawn(api::run_health_checks(self.db.clone(), upkeep.clone()));
        if let Some(metrics) = self.metrics {
            let addr = metrics.local_addr()?;
            tokio::spawn(crate::telemetry::serve_metrics(
                metrics,
                self.pool.clone(),
                self.connections.clone(),
                std::sync::Arc::new(std::sync::OnceLock::new()),
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
