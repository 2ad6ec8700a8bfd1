//! OpenTelemetry: the tracer behind `tracing`'s spans, and its OTLP export.
//!
//! The tracer is always installed, so that every request and job has a trace
//! id to log and to pass on (`traceparent`) even when nothing is exported.
//! Export is on when `OTEL_EXPORTER_OTLP_ENDPOINT` is set: OTLP over HTTP
//! with protobuf, batched on a thread of its own with a bounded queue, so a
//! slow or absent collector costs dropped spans, never a blocked request.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;

/// `service.name` when `OTEL_SERVICE_NAME` is unset.
pub const DEFAULT_SERVICE_NAME: &str = "outbox-relay";

/// What to export, read from the standard variables.
#[derive(Debug, Clone, Default)]
pub struct OtelSettings {
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`, e.g. `http://jaeger:4318`; `None`: no export.
    pub endpoint: Option<String>,
    /// `OTEL_SERVICE_NAME`.
    pub service_name: Option<String>,
}

impl OtelSettings {
    pub fn from_env() -> OtelSettings {
        let read = |name: &str| {
            std::env::var(name)
                .ok()
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        OtelSettings {
            endpoint: read("OTEL_EXPORTER_OTLP_ENDPOINT"),
            service_name: read("OTEL_SERVICE_NAME"),
        }
    }
}

/// The process's tracer provider; flush it with [`OtelGuard::shutdown`]
/// before the runtime stops, or buffered spans are lost.
#[derive(Debug)]
pub struct OtelGuard {
    provider: SdkTracerProvider,
}

impl OtelGuard {
    /// Exports what is buffered and stops the exporter. Blocks: call it
    /// outside the async runtime (which must still be running: the export
    /// itself runs on it).
    pub fn shutdown(self) {
        if let Err(error) = self.provider.shutdown_with_timeout(Duration::from_secs(5)) {
            eprintln!("warning: exporting the last spans failed: {error}");
        }
    }
}

/// Builds the tracer provider. `runtime` runs the exporter's HTTP calls;
/// without one (or without an endpoint) nothing is exported.
pub fn provider(
    settings: &OtelSettings,
    runtime: Option<tokio::runtime::Handle>,
) -> Result<SdkTracerProvider, String> {
    let service_name = settings
        .service_name
        .clone()
        .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned());
    let mut builder = SdkTracerProvider::builder()
        .with_resource(Resource::builder().with_service_name(service_name).build());
    if let (Some(endpoint), Some(runtime)) = (&settings.endpoint, runtime) {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(traces_url(endpoint))
            .with_timeout(Duration::from_secs(10))
            .with_http_client(RuntimeHttpClient::new(runtime)?)
            .build()
            .map_err(|e| format!("OTEL_EXPORTER_OTLP_ENDPOINT {endpoint}: {e}"))?;
        builder = builder.with_batch_exporter(exporter);
    }
    Ok(builder.build())
}

/// The signal URL for a base endpoint, as the OTLP specification builds it:
/// `<endpoint>/v1/traces`.
fn traces_url(endpoint: &str) -> String {
    format!("{}/v1/traces", endpoint.trim_end_matches('/'))
}

/// The `tracing` layer for `provider`, and the guard that flushes it.
pub fn layer<S>(
    provider: SdkTracerProvider,
) -> (
    tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>,
    OtelGuard,
)
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    let tracer = provider.tracer("outbox-relay");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        // Threads, code locations and events as span events are noise here;
        // the logs keep them.
        .with_threads(false)
        .with_location(false)
        .with_tracked_inactivity(false);
    (layer, OtelGuard { provider })
}

/// The exporter's HTTP client: reqwest on the process's tokio runtime. The
/// batch processor exports from a plain thread, where reqwest cannot run
/// without a runtime; each export is handed to `runtime` and awaited there.
#[derive(Debug)]
struct RuntimeHttpClient {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

impl RuntimeHttpClient {
    fn new(runtime: tokio::runtime::Handle) -> Result<Self, String> {
        crate::effects::webhook::ensure_crypto_provider();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("building the OTLP exporter's HTTP client: {e}"))?;
        Ok(RuntimeHttpClient { client, runtime })
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for RuntimeHttpClient {
    async fn send_bytes(
        &self,
        request: opentelemetry_http::Request<opentelemetry_http::Bytes>,
    ) -> Result<
        opentelemetry_http::Response<opentelemetry_http::Bytes>,
        opentelemetry_http::HttpError,
    > {
        let client = self.client.clone();
        let sent = self.runtime.spawn(async move {
            let request = reqwest::Request::try_from(request)?;
            let response = client.execute(request).await?;
            let mut answer = opentelemetry_http::Response::builder().status(response.status());
            if let Some(headers) = answer.headers_mut() {
                *headers = response.headers().clone();
            }
            let body = response.bytes().await?;
            Ok::<_, opentelemetry_http::HttpError>(answer.body(body)?)
        });
        sent.await?
    }
}
