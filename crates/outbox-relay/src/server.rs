//! The public HTTP server: the order API ([`crate::api`]) and the operator
//! dashboard ([`crate::admin`]) on one listener, behind one set of layers.
//! Neither knows the other; this is the one place that mounts both.
//!
//! Start one with [`Application::build`], then [`Application::run_until_stopped`]:
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use outbox_relay::api::{self, ApiSettings};
//! use outbox_relay::server::Application;
//!
//! let settings = ApiSettings::default();
//! let pool = api::connect("postgres://postgres@127.0.0.1/shop", &settings);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let app = Application::build(pool, settings, listener)?;
//! println!("listening on http://{}", app.local_addr());
//! app.run_until_stopped(outbox_relay::shutdown::on_signals()).await
//! # }
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::api::{self, ApiAuth, ApiSettings, Db};
use crate::db::PgPool;
use crate::http_server::ConnectionLimits;
use crate::outbox::Waker;
use crate::telemetry::run_metrics_upkeep;

/// The API's routes and the dashboard's on one gate in front of the pool, so
/// both count against the same connections.
fn router(pool: PgPool, settings: &ApiSettings, waker: Waker) -> Router {
    let db = Db::new(pool, settings.db_wait);
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
    waker: Waker,
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
        Ok(Application {
            listener,
            local_addr,
            router: router(pool.clone(), &settings, waker.clone()),
            shutdown_grace,
            connections,
            pool,
            waker,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves until `shutdown` is cancelled, then stops accepting, lets
    /// in-flight requests finish for up to `shutdown_grace`, and returns.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> std::io::Result<()> {
        let upkeep = CancellationToken::new();
        tokio::spawn(run_metrics_upkeep(upkeep.clone()));
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
