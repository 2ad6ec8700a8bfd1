//! Tracing subscriber set-up and the Prometheus metrics registry.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Installs the global subscriber: `RUST_LOG` filters (default `info`),
/// `LOG_FORMAT=json` gives JSON lines for log shippers. Logs go to stderr so
/// that stdout stays for command output. Calling it twice is harmless.
pub fn init_tracing() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    let registry = tracing_subscriber::registry().with(filter);
    let result = if json {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_writer(std::io::stderr),
            )
            .try_init()
    } else {
        registry
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .try_init()
    };
    // Already initialised (tests, or a library user's own subscriber): keep theirs.
    drop(result);
}

/// The process-wide Prometheus recorder, installed on first use.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets(&[
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0,
                ])
                .map(PrometheusBuilder::build_recorder)
                .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
            let handle = recorder.handle();
            // Fails only if another recorder is installed; ours still renders
            // (empty) rather than taking the process down.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

/// Serves `/metrics` (Prometheus text) and `/healthz` (200 when the database
/// answers, else 503) on `addr` until `shutdown`. The relay's sidecar endpoint.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    pool: crate::db::PgPool,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    use axum::routing::get;

    let handle = metrics_handle();
    let app = axum::Router::new()
        .route("/metrics", get(move || std::future::ready(handle.render())))
        .route(
            "/healthz",
            get(move || {
                let pool = pool.clone();
                async move { health(&pool).await }
            }),
        );
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

/// `200 {"status":"ok"}` when a `SELECT 1` succeeds, else `503` with the reason.
pub async fn health(
    pool: &crate::db::PgPool,
) -> (axum::http::StatusCode, axum::Json<serde_json::Value>) {
    use diesel::RunQueryDsl as _;
    let ping = crate::db::run_blocking(pool, |conn| {
        diesel::sql_query("SELECT 1").execute(conn)?;
        Ok(())
    });
    match tokio::time::timeout(std::time::Duration::from_secs(3), ping).await {
        Ok(Ok(())) => (
            axum::http::StatusCode::OK,
            axum::Json(serde_json::json!({"status": "ok", "database": "up"})),
        ),
        Ok(Err(error)) => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({"status": "unavailable", "database": error.to_string()})),
        ),
        Err(_) => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({"status": "unavailable", "database": "timed out"})),
        ),
    }
}
