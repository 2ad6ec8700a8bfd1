//! One trace from `POST /orders` to the receivers: `serve` and `relay` as
//! separate processes exporting OTLP/HTTP to a collector in the test, which
//! decodes the spans and checks who is whose parent.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use diesel::prelude::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message as _;
use reqwest::StatusCode;

use crate::faults::{Sinks, wait_all_terminal};
use crate::support::http::Answer;
use crate::support::process::{BinProcess, Launch};
use crate::support::{TestDb, order_json};

/// One span as the collector received it.
#[derive(Debug, Clone)]
struct Span {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    attributes: HashMap<String, String>,
}

/// An OTLP/HTTP trace receiver on port 0: `POST /v1/traces` with a protobuf
/// `ExportTraceServiceRequest`.
struct Collector {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Collector {
    async fn start() -> Collector {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&spans);
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: Bytes| {
                let sink = Arc::clone(&sink);
                async move {
                    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
                        return StatusCode::BAD_REQUEST;
                    };
                    let mut spans = sink.lock().expect("spans");
                    for resource in request.resource_spans {
                        let service = resource
                            .resource
                            .iter()
                            .flat_map(|r| &r.attributes)
                            .find(|kv| kv.key == "service.name")
                            .map(|kv| any_value(kv.value.as_ref()))
                            .unwrap_or_default();
                        for scope in resource.scope_spans {
                            for span in scope.spans {
                                spans.push(Span {
                                    service: service.clone(),
                                    name: span.name,
                                    trace_id: hex::encode(span.trace_id),
                                    span_id: hex::encode(span.span_id),
                                    parent_span_id: hex::encode(span.parent_span_id),
                                    attributes: span
                                        .attributes
                                        .iter()
                                        .map(|kv| (kv.key.clone(), any_value(kv.value.as_ref())))
                                        .collect(),
                                });
                            }
                        }
                    }
                    StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the collector");
        let addr = listener.local_addr().expect("collector address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        Collector { addr, spans }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn spans_of(&self, trace_id: &str) -> Vec<Span> {
        self.spans
            .lock()
            .expect("spans")
            .iter()
            .filter(|s| s.trace_id == trace_id)
            .cloned()
            .collect()
    }
}

fn any_value(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    match value.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        _ => String::new(),
    }
}

/// `(trace id, parent id)` of a `traceparent` header value.
fn parse_traceparent(value: &str) -> (String, String) {
    let parts: Vec<&str> = value.split('-').collect();
    assert_eq!(parts.len(), 4, "traceparent {value:?}");
    assert_eq!(parts[0], "00", "traceparent {value:?}");
    (parts[1].to_owned(), parts[2].to_owned())
}

fn one<'a>(spans: &'a [Span], service: &str, name: &str) -> &'a Span {
    let found: Vec<&Span> = spans
        .iter()
        .filter(|s| s.service == service && s.name == name)
        .collect();
    assert_eq!(found.len(), 1, "one {service}/{name} span in {spans:#?}");
    found[0]
}

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_runs_from_post_orders_through_the_relay_to_the_receivers() {
    let db = TestDb::new();
    let collector = Collector::start().await;
    let sinks = Sinks::start([], Answer::status(200)).await;
    let (mut api, base) = BinProcess::start_api(
        Launch::serve("traced-api", &db.url)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint())
            .env("OTEL_SERVICE_NAME", "orders-api"),
    )
    .await;
    let (mut relay, _) = BinProcess::start_relay(
        sinks
            .relay("traced-relay", &db.url)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint())
            .env("OTEL_SERVICE_NAME", "orders-relay")
            // "effect succeeded", inside the job's span, is a debug line.
            .env("RUST_LOG", "info,order_service=debug,outbox_core=debug"),
    )
    .await;
    let client = crate::support::app::http_client_with_key(&crate::support::app::create_api_key(
        &db.url,
        "traced",
        &[order_service::api_keys::Scope::All],
    ));

    // One order continues the caller's trace, one starts its own.
    let traced = client
        .post(format!("{base}/orders"))
        .header("traceparent", format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
        .header("tracestate", "shop=1")
        .json(&order_json("Ada Lovelace"))
        .send()
        .await
        .expect("POST /orders with a traceparent");
    assert_eq!(traced.status(), StatusCode::CREATED);
    let untraced = client
        .post(format!("{base}/orders"))
        .json(&order_json("Grace Hopper"))
        .send()
        .await
        .expect("POST /orders without one");
    assert_eq!(untraced.status(), StatusCode::CREATED);
    let mut conn = db.conn();
    wait_all_terminal(&mut conn, Duration::from_secs(60)).await;
    // Stopping both flushes their batched spans.
    relay.terminate().await;
    api.terminate().await;

    // The receivers saw the caller's trace.
    let webhooks = sinks.http.requests();
    assert_eq!(webhooks.len(), 2, "two webhooks");
    let webhook_trace_ids: Vec<String> = webhooks
        .iter()
        .map(|r| {
            let header = r.headers.get("traceparent").expect("webhook traceparent");
            parse_traceparent(header.to_str().expect("ASCII")).0
        })
        .collect();
    assert!(
        webhook_trace_ids.iter().any(|t| t == CALLER_TRACE),
        "{webhook_trace_ids:?}"
    );
    let mails = sinks.smtp.mails();
    assert_eq!(mails.len(), 2, "two mails");
    let mail_trace_ids: Vec<String> = mails
        .iter()
        .map(|m| parse_traceparent(&m.header("traceparent").expect("mail traceparent")).0)
        .collect();
    assert!(
        mail_trace_ids.iter().any(|t| t == CALLER_TRACE),
        "{mail_trace_ids:?}"
    );

    // The caller's trace holds the request, the placement and every job.
    let trace = collector.spans_of(CALLER_TRACE);
    let request = one(&trace, "orders-api", "http_request");
    assert_eq!(request.parent_span_id, CALLER_SPAN);
    let placement = one(&trace, "orders-api", "place_order");
    assert_eq!(placement.parent_span_id, request.span_id);
    let jobs: Vec<&Span> = trace
        .iter()
        .filter(|s| s.service == "orders-relay" && s.name == "job")
        .collect();
    let mut kinds: Vec<&str> = jobs
        .iter()
        .map(|s| s.attributes.get("kind").map_or("", String::as_str))
        .collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        ["confirmation_email", "order_webhook", "receipt_pdf"],
        "{trace:#?}"
    );
    for job in &jobs {
        assert_eq!(job.parent_span_id, placement.span_id, "{job:#?}");
    }
    // The webhook's traceparent names the job's span (or one inside it).
    let webhook_parent = webhooks
        .iter()
        .filter_map(|r| {
            r.headers
                .get("traceparent")?
                .to_str()
                .ok()
                .map(parse_traceparent)
        })
        .find(|(trace_id, _)| trace_id == CALLER_TRACE)
        .map(|(_, parent)| parent)
        .expect("the traced webhook");
    assert!(
        trace
            .iter()
            .any(|s| s.span_id == webhook_parent && s.service == "orders-relay"),
        "the webhook's parent {webhook_parent} is a relay span of the trace"
    );

    // Without a traceparent, the API starts a trace and the relay continues it.
    let other_trace = webhook_trace_ids
        .iter()
        .find(|t| *t != CALLER_TRACE)
        .expect("the untraced order's webhook has a trace of its own");
    let trace = collector.spans_of(other_trace);
    let request = one(&trace, "orders-api", "http_request");
    assert!(
        request.parent_span_id.is_empty(),
        "a new trace starts at the request: {request:#?}"
    );
    let placement = one(&trace, "orders-api", "place_order");
    let jobs: Vec<&Span> = trace
        .iter()
        .filter(|s| s.service == "orders-relay" && s.name == "job")
        .collect();
    assert_eq!(jobs.len(), 3, "{trace:#?}");
    for job in &jobs {
        assert_eq!(job.parent_span_id, placement.span_id, "{job:#?}");
    }
    assert!(mail_trace_ids.contains(other_trace), "{mail_trace_ids:?}");

    // The stored context is what the relay continued.
    let stored: Vec<Option<serde_json::Value>> = order_service::schema::jobs_all::table
        .select(order_service::schema::jobs_all::trace_context)
        .load(&mut conn)
        .expect("trace contexts");
    assert!(stored.iter().all(Option::is_some), "{stored:?}");
    // And the logs name the trace.
    assert!(
        relay.stderr().contains(CALLER_TRACE),
        "the relay's log lines carry trace_id"
    );
    assert!(api.stderr().contains(CALLER_TRACE), "so do the API's");
}
