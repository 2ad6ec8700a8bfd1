//! Tracing subscriber set-up and the Prometheus metrics registry.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Registry, reload};

/// Installs the global subscriber: `RUST_LOG` filters (default `info`),
/// `LOG_FORMAT=json` gives JSON lines for log shippers. Logs go to stderr so
/// that stdout stays for command output. Calling it twice is harmless.
/// Spans get OpenTelemetry trace ids (logged as `trace_id` by the spans that
/// declare it), exported nowhere: see [`init_tracing_with`] for export.
pub fn init_tracing() {
    let _ = init_tracing_with("info", &crate::otel::OtelSettings::default(), None);
}

/// [`init_tracing`] with another filter when `RUST_LOG` is unset (`bench`
/// keeps its table readable with `warn`).
pub fn init_tracing_with_default(default_filter: &str) {
    let _ = init_tracing_with(default_filter, &crate::otel::OtelSettings::default(), None);
}

/// The subscriber, with OTLP export per `otel` when `runtime` is given to
/// run the exporter's calls on. Returns the guard that flushes the exporter,
/// or `None` when this process already had a subscriber (or export failed
/// to set up, which is logged: traces are not worth refusing to start).
pub fn init_tracing_with(
    default_filter: &str,
    otel: &crate::otel::OtelSettings,
    runtime: Option<tokio::runtime::Handle>,
) -> Option<crate::otel::OtelGuard> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let json = std::env::var("LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    let (provider, otel_error) = match crate::otel::provider(otel, runtime) {
        Ok(provider) => (provider, None),
        Err(error) => (
            crate::otel::provider(&crate::otel::OtelSettings::default(), None)
                .unwrap_or_else(|_| opentelemetry_sdk::trace::SdkTracerProvider::builder().build()),
            Some(error),
        ),
    };
    let (otel_layer, guard) = crate::otel::layer(provider);
    let (filter, handle) = reload::Layer::new(filter);
    let registry = tracing_subscriber::registry().with(filter).with(otel_layer);
    let result = if json {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(true)
                    // Every enclosing span, so that a line deep inside a
                    // request or a job still shows the trace_id of its root.
                    .with_span_list(true)
                    .with_writer(std::io::stderr),
            )
            .try_init()
    } else {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(use_colour())
                    .with_writer(std::io::stderr),
            )
            .try_init()
    };
    // Already initialised (tests, or a library user's own subscriber): keep theirs.
    if result.is_err() {
        return None;
    }
    let _ = FILTER.set(handle);
    if let Some(error) = otel_error {
        tracing::warn!(error = %error, "OpenTelemetry export is off");
    } else if let Some(endpoint) = &otel.endpoint {
        tracing::info!(endpoint = %endpoint, "exporting traces over OTLP/HTTP");
    }
    Some(guard)
}

/// Colour codes in a file or a log shipper's pipe are noise: colour only a
/// terminal, and never when `NO_COLOR` is set (to anything but empty).
fn use_colour() -> bool {
    use std::io::IsTerminal as _;
    colour_wanted(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    )
}

fn colour_wanted(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// Replaces the default `info` filter with `directives`, unless `RUST_LOG`
/// chose one. For commands whose own output is the interface (`demo` draws a
/// live table that log lines would tear), started after [`init_tracing`].
pub fn set_default_log_filter(directives: &str) {
    if std::env::var_os("RUST_LOG").is_some() {
        return;
    }
    if let (Some(handle), Ok(filter)) = (FILTER.get(), EnvFilter::try_new(directives)) {
        let _ = handle.reload(filter);
    }
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
            describe_metrics();
            handle
        })
        .clone()
}

/// `# HELP` lines for every metric this crate emits; the list docs/operations.md shows.
fn describe_metrics() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "outbox_jobs_claimed_total",
        "Jobs claimed by this relay, by kind."
    );
    describe_counter!(
        "outbox_jobs_finished_total",
        "Attempts whose outcome was recorded, by kind and outcome (done, retried, failed)."
    );
    describe_counter!(
        "outbox_lease_lost_total",
        "Outcomes discarded because the job was reaped and taken over, by kind."
    );
    describe_counter!(
        "outbox_jobs_reaped_total",
        "Expired leases put back, by outcome (requeued, failed)."
    );
    describe_counter!(
        "outbox_endpoints_disabled_total",
        "Endpoints the circuit breaker disabled after ENDPOINT_DISABLE_AFTER of failures, by endpoint."
    );
    describe_counter!(
        "outbox_stranded_keys_released_total",
        "Ordering keys the reaper's sweep released: a head ended without releasing the next job."
    );
    describe_histogram!(
        "outbox_effect_duration_seconds",
        Unit::Seconds,
        "Time one effect took, by kind."
    );
    describe_histogram!(
        "outbox_claim_batch_size",
        "Jobs returned by one claim statement."
    );
    describe_counter!("outbox_claim_errors_total", "Claim statements that failed.");
    describe_counter!(
        "outbox_jobs_timed_out_total",
        "Effects cancelled at their deadline (RELAY_JOB_TIMEOUT), by kind."
    );
    describe_counter!(
        "outbox_outcome_write_errors_total",
        "Outcomes the database refused inside a batch, written alone as a failure instead, by kind."
    );
    describe_gauge!(
        "outbox_listener_connected",
        "1 while the relay's LISTEN connection is up (NOTIFY wakes it at once), 0 while it only polls."
    );
    describe_gauge!(
        "outbox_jobs",
        "Jobs in the table by status, refreshed at most every few seconds."
    );
    describe_counter!(
        "http_requests_total",
        "HTTP requests answered, by method, route and status."
    );
    describe_histogram!(
        "http_request_duration_seconds",
        Unit::Seconds,
        "Time to answer an HTTP request, by method, route and status."
    );
}

/// Histograms keep their samples until someone drains them; a scrape does, but
/// a process nobody scrapes would grow without bound. Runs until `shutdown`.
pub async fn run_metrics_upkeep(shutdown: tokio_util::sync::CancellationToken) {
    let handle = metrics_handle();
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => handle.run_upkeep(),
        }
    }
}

/// The `outbox_jobs{status}` gauge, refreshed from the database on scrape when
/// older than `ttl`, so many scrapers (or a fast one) cost at most one cheap
/// query per `ttl`.
#[derive(Debug)]
pub struct QueueDepthGauge {
    ttl: std::time::Duration,
    /// When the last refresh was tried; the lock also makes concurrent scrapes
    /// wait for one refresh instead of each running the query.
    last_refresh: tokio::sync::Mutex<Option<std::time::Instant>>,
}

impl QueueDepthGauge {
    /// How long a refresh may take before the scrape goes on with old values.
    const REFRESH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

    pub fn new(ttl: std::time::Duration) -> Self {
        QueueDepthGauge {
            ttl,
            last_refresh: tokio::sync::Mutex::new(None),
        }
    }

    /// Runs `load` if the gauge is stale and publishes its counts. A failed
    /// refresh keeps the previous values and logs why; the next try waits a
    /// full `ttl`, so a database outage is not hammered by scrapes.
    pub async fn refresh_if_stale<F, Fut, E>(&self, load: F)
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<crate::outbox::QueueDepth, E>>,
        E: std::fmt::Display,
    {
        let mut last = self.last_refresh.lock().await;
        if last.is_some_and(|at| at.elapsed() < self.ttl) {
            return;
        }
        *last = Some(std::time::Instant::now());
        match tokio::time::timeout(Self::REFRESH_TIMEOUT, load()).await {
            Ok(Ok(depth)) => {
                for status in crate::outbox::JobStatus::ALL {
                    metrics::gauge!("outbox_jobs", "status" => status.as_str())
                        .set(depth.count(status) as f64);
                }
            }
            Ok(Err(error)) => {
                tracing::warn!(error = %error, "could not refresh the queue depth gauge");
            }
            Err(_) => tracing::warn!(
                timeout = ?Self::REFRESH_TIMEOUT,
                "could not refresh the queue depth gauge: the query timed out"
            ),
        }
    }
}

/// How often the relay's `/metrics` re-counts the queue (the API's:
/// `ApiSettings::queue_depth_ttl`).
pub const QUEUE_DEPTH_TTL: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves the relay's sidecar endpoint (and the API's `METRICS_ADDR`) on
/// `listener` until `shutdown`:
/// `/metrics` (Prometheus text); `/healthz` (200 when the database answers,
/// else 503); `/readyz` (the same, and 503 while a NATS connection this relay
/// has made is down, each listed under `"nats"`); `/livez` (503 when `liveness` says the relay is
/// stuck; it does not ask the database, so an outage restarts no relay). The
/// relay fills `liveness` once it runs: while its start waits for a primary,
/// `/livez` answers 200 and `/readyz` 503.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    pool: crate::db::PgPool,
    limits: crate::http_server::ConnectionLimits,
    liveness: std::sync::Arc<std::sync::OnceLock<crate::worker_pool::Liveness>>,
    nats: Option<crate::effects::nats::NatsConnections>,
    queue_depth_ttl: std::time::Duration,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    use axum::routing::get;

    let handle = metrics_handle();
    let gauge = std::sync::Arc::new(QueueDepthGauge::new(queue_depth_ttl));
    let metrics_pool = pool.clone();
    let ready = move || {
        let pool = pool.clone();
        async move { health(&pool).await }
    };
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let (handle, gauge, pool) = (handle.clone(), gauge.clone(), metrics_pool.clone());
                async move {
                    gauge
                        .refresh_if_stale(|| {
                            crate::db::run_blocking(&pool, |conn| {
                                Ok(crate::outbox::queue_depth(conn)?)
                            })
                        })
                        .await;
                    prometheus_text(handle.render())
                }
            }),
        )
        .route(
            "/livez",
            get(move || {
                let liveness = liveness.clone();
                async move { live(liveness.get()) }
            }),
        )
        .route("/healthz", get(ready.clone()))
        .route(
            "/readyz",
            get(move || {
                let (ready, nats) = (ready.clone(), nats.clone());
                async move { with_nats(ready().await, nats.as_ref()).await }
            }),
        );
    tokio::spawn(run_metrics_upkeep(shutdown.clone()));
    // A scrape is quick: a short grace is plenty.
    crate::http_server::serve(listener, app, limits, shutdown, Duration::from_secs(5)).await
}

/// The database's answer, with the state of each NATS connection under
/// `"nats"`; 503 while one is not connected (its publishes wait and retry).
async fn with_nats(
    answer: (axum::http::StatusCode, axum::Json<serde_json::Value>),
    nats: Option<&crate::effects::nats::NatsConnections>,
) -> (axum::http::StatusCode, axum::Json<serde_json::Value>) {
    let Some(nats) = nats else { return answer };
    let (mut status, axum::Json(mut body)) = answer;
    let states = nats.states().await;
    if states.is_empty() {
        return (status, axum::Json(body));
    }
    if states.iter().any(|(_, state)| *state != "connected") {
        status = axum::http::StatusCode::SERVICE_UNAVAILABLE;
        body["status"] = "unavailable".into();
    }
    body["nats"] = states
        .into_iter()
        .map(|(url, state)| (url, serde_json::Value::from(state)))
        .collect::<serde_json::Map<_, _>>()
        .into();
    (status, axum::Json(body))
}

/// `200 {"status":"live"}` while the relay makes progress, else `503` with what
/// is stuck.
fn live(
    liveness: Option<&crate::worker_pool::Liveness>,
) -> (axum::http::StatusCode, axum::Json<serde_json::Value>) {
    match liveness.map_or(Ok(()), crate::worker_pool::Liveness::check) {
        Ok(()) => (
            axum::http::StatusCode::OK,
            axum::Json(serde_json::json!({"status": "live"})),
        ),
        Err(reason) => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({"status": "stalled", "reason": reason})),
        ),
    }
}

/// Rendered metrics with the content type Prometheus expects.
pub fn prometheus_text(body: String) -> impl axum::response::IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
}

/// The answer of every `/healthz` (the API's and the relay's), in one shape:
/// `200 {"status":"ok","database":"up"}` when the database answered, else
/// `503 {"status":"unavailable","database":"down","error":{"code","message"}}`.
pub fn health_answer(
    error: Option<serde_json::Value>,
) -> (axum::http::StatusCode, axum::Json<serde_json::Value>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    // Once per outage at WARN: a probe every few seconds during a failover (or a
    // start that waits for a primary) would otherwise repeat it each time.
    static FAILING: AtomicBool = AtomicBool::new(false);
    match error {
        None => {
            if FAILING.swap(false, Ordering::AcqRel) {
                tracing::info!("health check passes again");
            }
            (
                axum::http::StatusCode::OK,
                axum::Json(serde_json::json!({"status": "ok", "database": "up"})),
            )
        }
        Some(error) => {
            if FAILING.swap(true, Ordering::AcqRel) {
                tracing::debug!(error = %error, "health check failed");
            } else {
                tracing::warn!(error = %error, "health check failed");
            }
            (
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(serde_json::json!({
                    "status": "unavailable",
                    "database": "down",
                    "error": error,
                })),
            )
        }
    }
}

/// The relay's `/healthz`: [`health_answer`] for a `SELECT 1` on `pool`,
/// given at most 3s.
pub async fn health(
    pool: &crate::db::PgPool,
) -> (axum::http::StatusCode, axum::Json<serde_json::Value>) {
    use diesel::RunQueryDsl as _;
    let ping = crate::db::run_blocking(pool, |conn| {
        diesel::sql_query("SELECT 1").execute(conn)?;
        Ok(())
    });
    let unavailable = |message: String| {
        Some(serde_json::json!({"code": "database_unavailable", "message": message}))
    };
    health_answer(
        match tokio::time::timeout(std::time::Duration::from_secs(3), ping).await {
            Ok(Ok(())) => None,
            Ok(Err(error)) => unavailable(error.to_string()),
            Err(_) => unavailable("the database did not answer within 3s".to_owned()),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_and_never_under_no_color() {
        use std::ffi::OsStr;
        assert!(colour_wanted(true, None));
        assert!(!colour_wanted(false, None), "a file or a pipe");
        assert!(!colour_wanted(true, Some(OsStr::new("1"))));
        assert!(
            colour_wanted(true, Some(OsStr::new(""))),
            "NO_COLOR= set empty"
        );
    }
}
