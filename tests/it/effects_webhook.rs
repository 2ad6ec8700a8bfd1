//! order_webhook end to end: a real relay, a real HTTP receiver on port 0.

use order_service::orders::order_enqueuer;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use hmac::{Hmac, Mac};
use order_service::effects::EffectError;
use order_service::effects::receipt::ReceiptSettings;
use order_service::effects::webhook::{WebhookConfig, WebhookSender};
use order_service::effects::{self, JobHandler};
use order_service::orders::{
    NewOrder, OrderEvent, OrderId, load_order, load_order_events, place_order,
};
use order_service::schema::jobs_all;
use sha2::Sha256;

use crate::support::http::{Answer, HttpSink, Recorded};
use crate::support::{
    RunningRelay, TestDb, count, init_tracing, order_json, spawn_relay, test_settings, wait_until,
};

const SECRET: &str = "whsec-test-0123456789";

fn sender(sink: &HttpSink, timeout: Duration) -> WebhookSender {
    WebhookSender::new(&WebhookConfig {
        url: sink.url(),
        secret: SECRET.to_owned(),
        timeout,
        allow_private: true,
    })
    .expect("webhook sender")
}

/// Places one order; returns its id and the id of its order_webhook job.
/// The `order.placed` event of `order_id`, which its delivery sends.
fn placed_event(conn: &mut PgConnection, order_id: i64) -> OrderEvent {
    load_order_events(conn, OrderId::new(order_id))
        .expect("load events")
        .into_iter()
        .next()
        .expect("the placement's event")
}

fn place(conn: &mut PgConnection, max_attempts: i32) -> (i64, i64) {
    let order = NewOrder::parse(&order_json("Ada Lovelace")).expect("valid order");
    let order_id = place_order(conn, &order_enqueuer(), &order, None, max_attempts)
        .expect("place order")
        .order_id();
    let job_id = jobs_all::table
        .filter(jobs_all::order_id.eq(order_id))
        .filter(jobs_all::kind.eq("order_webhook"))
        .select(jobs_all::id)
        .first(conn)
        .expect("order_webhook job");
    (order_id, job_id)
}

fn webhook_relay(db: &TestDb, sender: WebhookSender) -> RunningRelay {
    let effects: Arc<dyn JobHandler> = Arc::new(effects::workers(
        db.pool(4),
        None,
        Some(sender),
        ReceiptSettings::default(),
    ));
    spawn_relay(
        db,
        test_settings("webhook-relay", &["order_webhook"]),
        effects,
    )
}

#[derive(Debug, Queryable)]
struct JobState {
    status: String,
    attempts: i32,
    last_error: Option<String>,
    run_after: DateTime<Utc>,
}

fn job(conn: &mut PgConnection, id: i64) -> JobState {
    jobs_all::table
        .find(id)
        .select((
            jobs_all::status,
            jobs_all::attempts,
            jobs_all::last_error,
            jobs_all::run_after,
        ))
        .first(conn)
        .expect("job row")
}

/// Checks `X-Signature` with an HMAC computed here, not by the code under test.
fn assert_signed(request: &Recorded) {
    let header = request.header("x-signature").expect("X-Signature header");
    let hex_sig = header
        .strip_prefix("sha256=")
        .unwrap_or_else(|| panic!("X-Signature {header:?} starts with sha256="));
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).expect("HMAC key");
    mac.update(&request.body);
    mac.verify_slice(&hex::decode(hex_sig).expect("hex signature"))
        .expect("signature verifies against the body");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivered_webhook_is_signed_json_with_a_stable_idempotency_key() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = HttpSink::start([], Answer::status(204)).await;
    let (order_id, job_id) = place(&mut conn, 8);

    let relay = webhook_relay(&db, sender(&sink, Duration::from_secs(5)));
    wait_until("the webhook job is done", Duration::from_secs(20), || {
        count(&mut conn, "done") == 1
    })
    .await;
    relay.stop().await;

    let requests = sink.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/hooks/orders");
    assert_eq!(request.header("content-type"), Some("application/json"));
    let expected_key = format!("order-webhook-{job_id}");
    assert_eq!(
        request.header("idempotency-key"),
        Some(expected_key.as_str())
    );
    let agent = request.header("user-agent").expect("User-Agent");
    assert!(agent.starts_with("outbox-relay/"), "{agent}");
    assert_signed(request);

    let body = request.json();
    assert_eq!(body["event"], "order.placed");
    let order = &body["order"];
    assert_eq!(order["id"], order_id);
    assert_eq!(order["customer_name"], "Ada Lovelace");
    assert_eq!(order["currency"], "EUR");
    assert_eq!(order["total_cents"], 2100);
    assert_eq!(order["items"].as_array().map(Vec::len), Some(2));
    assert_eq!(order["items"][0]["sku"], "TEA-1");
    assert_eq!(order["items"][0]["quantity"], 2);
    assert_eq!(order["items"][0]["unit_price_cents"], 450);
    assert_eq!(order["items"][0]["line_total_cents"], 900);
    let job = job(&mut conn, job_id);
    assert_eq!((job.status.as_str(), job.attempts), ("done", 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_then_200_is_retried_and_done_after_two_attempts_with_the_same_key_and_body() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = HttpSink::start(
        [Answer::status(500).body("database is down")],
        Answer::status(200),
    )
    .await;
    let (_, job_id) = place(&mut conn, 8);

    let relay = webhook_relay(&db, sender(&sink, Duration::from_secs(5)));
    wait_until("the webhook job is done", Duration::from_secs(20), || {
        count(&mut conn, "done") == 1
    })
    .await;
    relay.stop().await;

    let job = job(&mut conn, job_id);
    assert_eq!((job.status.as_str(), job.attempts), ("done", 2));
    let requests = sink.requests();
    assert_eq!(requests.len(), 2);
    let keys: Vec<_> = requests
        .iter()
        .map(|r| r.header("idempotency-key"))
        .collect();
    assert_eq!(keys[0], Some(format!("order-webhook-{job_id}").as_str()));
    assert_eq!(keys[0], keys[1], "the same key on every attempt");
    assert_eq!(
        requests[0].body, requests[1].body,
        "the same bytes on every attempt"
    );
    requests.iter().for_each(assert_signed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_400_fails_the_job_after_one_attempt_with_the_status_and_a_short_excerpt() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let long_body = format!(
        "{{\"error\":\"customer_email rejected\",\"trace\":\"{}\"}}",
        "ж".repeat(5000)
    );
    let sink = HttpSink::start([], Answer::status(400).body(long_body)).await;
    let (_, job_id) = place(&mut conn, 8);

    let relay = webhook_relay(&db, sender(&sink, Duration::from_secs(5)));
    wait_until("the webhook job failed", Duration::from_secs(20), || {
        count(&mut conn, "failed") == 1
    })
    .await;
    relay.stop().await;

    let job = job(&mut conn, job_id);
    assert_eq!(job.attempts, 1);
    assert_eq!(sink.requests().len(), 1);
    let error = job.last_error.expect("last_error");
    assert!(error.contains("400 Bad Request"), "{error}");
    assert!(error.contains("customer_email rejected"), "{error}");
    assert!(error.chars().count() < 400, "bounded: {error}");
    assert!(!error.contains(SECRET));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_retry_after_holds_the_next_attempt_back_that_long() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = HttpSink::start(
        [Answer::status(429).header("retry-after", "1")],
        Answer::status(200),
    )
    .await;
    let (_, job_id) = place(&mut conn, 8);

    let relay = webhook_relay(&db, sender(&sink, Duration::from_secs(5)));
    // The test backoff is at most 100ms, so a wait near a second is the receiver's.
    wait_until("the 429 is recorded", Duration::from_secs(20), || {
        let job = job(&mut conn, job_id);
        job.status == "pending" && job.attempts == 1
    })
    .await;
    let waiting = job(&mut conn, job_id);
    let first = sink.requests()[0].at;
    assert!(
        waiting.run_after >= first + chrono::Duration::milliseconds(950),
        "run_after {} is not a second after the 429 at {first}",
        waiting.run_after
    );
    let error = waiting.last_error.expect("last_error");
    assert!(error.contains("429 Too Many Requests"), "{error}");
    assert!(error.contains("Retry-After 1s"), "{error}");

    wait_until("the webhook job is done", Duration::from_secs(20), || {
        count(&mut conn, "done") == 1
    })
    .await;
    relay.stop().await;
    let requests = sink.requests();
    assert_eq!(requests.len(), 2);
    let gap = requests[1].at - requests[0].at;
    assert!(
        gap >= chrono::Duration::milliseconds(950),
        "retried after {gap}"
    );
    assert_eq!(job(&mut conn, job_id).attempts, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_hangs_past_the_timeout_is_retried_until_attempts_run_out() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = HttpSink::start([], Answer::Hang(Duration::from_secs(30))).await;
    let (_, job_id) = place(&mut conn, 2);

    let started = Instant::now();
    let relay = webhook_relay(&db, sender(&sink, Duration::from_millis(300)));
    wait_until("the webhook job failed", Duration::from_secs(20), || {
        count(&mut conn, "failed") == 1
    })
    .await;
    relay.stop().await;

    assert!(started.elapsed() < Duration::from_secs(10));
    let job = job(&mut conn, job_id);
    assert_eq!(job.attempts, 2, "the timeout was retried");
    assert_eq!(sink.requests().len(), 2);
    let error = job.last_error.expect("last_error");
    assert!(
        error.contains("no attempts left") && error.contains("timed out"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_retryable_and_names_only_the_origin() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let (order_id, _) = place(&mut conn, 8);
    let order = load_order(&mut conn, OrderId::new(order_id))
        .expect("load order")
        .expect("order exists");
    let placed = placed_event(&mut conn, order_id);
    // A port that was free a moment ago: nothing listens there now.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let sender = WebhookSender::new(&WebhookConfig {
        url: url::Url::parse(&format!("http://127.0.0.1:{port}/hook/tok-SECRETPATH")).expect("url"),
        secret: SECRET.to_owned(),
        timeout: Duration::from_secs(5),
        allow_private: true,
    })
    .expect("sender");

    let error = sender
        .deliver(1, &order, &placed)
        .await
        .expect_err("nothing listens");
    let EffectError::Retryable { message, .. } = &error else {
        panic!("not retryable: {error:?}");
    };
    assert!(message.contains("cannot connect"), "{message}");
    assert!(!message.contains("SECRETPATH"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_webhook_allow_private_a_receiver_on_loopback_is_never_called() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let (order_id, _) = place(&mut conn, 8);
    let order = load_order(&mut conn, OrderId::new(order_id))
        .expect("load order")
        .expect("order exists");
    let placed = placed_event(&mut conn, order_id);
    let sink = HttpSink::start([], Answer::status(204)).await;
    let guarded = |url: url::Url| {
        WebhookSender::new(&WebhookConfig {
            url,
            secret: SECRET.to_owned(),
            timeout: Duration::from_secs(5),
            allow_private: false,
        })
        .expect("sender")
    };

    // A literal address: refused for good, since it will never be public.
    let error = guarded(sink.url())
        .deliver(1, &order, &placed)
        .await
        .expect_err("loopback refused");
    let EffectError::Permanent { message } = &error else {
        panic!("not permanent: {error:?}");
    };
    assert!(
        message.contains("127.0.0.1 is a loopback, private or link-local address"),
        "{message}"
    );
    assert!(message.contains("WEBHOOK_ALLOW_PRIVATE"), "{message}");

    // A name that resolves to loopback, as a rebound DNS name would: refused
    // at connect time, by the resolver, before any byte is sent.
    let mut by_name = sink.url();
    by_name.set_host(Some("localhost")).expect("host");
    let error = guarded(by_name)
        .deliver(2, &order, &placed)
        .await
        .expect_err("a name resolving to loopback refused");
    assert!(
        format!("{error:?}").contains("resolves only to loopback, private or link-local addresses"),
        "{error:?}"
    );
    assert!(sink.requests().is_empty(), "the receiver was called");
}

/// The Standard Webhooks reference verifier, the specification's own Rust
/// crate `standardwebhooks`, given one request and one secret: `Ok` when it
/// accepts the request, else what it said. A `whsec_` secret's key is its
/// base64 tail; any other secret is keyed as its bytes, as our signer does.
fn reference_verify(request: &Recorded, secret: &str) -> Result<(), String> {
    let verifier = if secret.starts_with("whsec_") {
        standardwebhooks::Webhook::new(secret).map_err(|e| e.to_string())?
    } else {
        standardwebhooks::Webhook::from_bytes(secret.as_bytes().to_vec())
            .map_err(|e| e.to_string())?
    };
    let mut headers = reqwest::header::HeaderMap::new();
    for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        if let Some(value) = request.header(name) {
            headers.insert(name, value.parse().expect("a header value"));
        }
    }
    verifier
        .verify(&request.body, &headers)
        .map_err(|e| e.to_string())
}

/// The same check by the Python reference library (`standardwebhooks` from
/// PyPI, run by `$PYTHON` or `python3`), a second implementation to agree
/// with. `None` when Python or the package is not installed: the Rust
/// verifier above is the one every run relies on.
fn python_reference_verify(request: &Recorded, secret: &str) -> Option<Result<(), String>> {
    // The package base64-decodes every secret given as text; a raw secret is
    // handed over as its bytes, which is how our signer keys it.
    const SCRIPT: &str = r#"
import base64, json, sys
try:
    from standardwebhooks.webhooks import Webhook
except ImportError:
    sys.exit(3)
req = json.load(sys.stdin)
secret = req["secret"]
key = secret if secret.startswith("whsec_") else secret.encode()
Webhook(key).verify(base64.b64decode(req["body"]), req["headers"])
print("verified")
"#;
    let headers: serde_json::Map<String, serde_json::Value> =
        ["webhook-id", "webhook-timestamp", "webhook-signature"]
            .into_iter()
            .filter_map(|name| Some((name.to_owned(), request.header(name)?.into())))
            .collect();
    let input = serde_json::json!({
        "secret": secret,
        "headers": headers,
        "body": base64::engine::general_purpose::STANDARD.encode(&request.body),
    });
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let Ok(mut child) = Command::new(&python)
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        return None;
    };
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.to_string().as_bytes())
        .expect("write the request to the verifier");
    let output = child.wait_with_output().expect("the verifier finishes");
    if output.status.code() == Some(3) {
        return None;
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    Some(
        if output.status.success() && output.stdout.starts_with(b"verified") {
            Ok(())
        } else {
            Err(stderr.trim().lines().last().unwrap_or_default().to_owned())
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_verifier_accepts_a_delivery_with_each_of_two_rotated_secrets() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = HttpSink::start([], Answer::status(204)).await;
    let old = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let new = "rotated-raw-secret-2026";
    let both = format!("{old} {new}");
    sink.verify_signatures_with(&both);
    let (order_id, job_id) = place(&mut conn, 8);
    let order = load_order(&mut conn, OrderId::new(order_id))
        .expect("load order")
        .expect("order exists");
    let placed = placed_event(&mut conn, order_id);
    let sender = WebhookSender::new(&WebhookConfig {
        url: sink.url(),
        secret: both.clone(),
        timeout: Duration::from_secs(5),
        allow_private: true,
    })
    .expect("sender");

    sender
        .deliver(job_id, &order, &placed)
        .await
        .expect("delivered");

    let requests = sink.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(
        request.header("webhook-id"),
        request.header("idempotency-key")
    );
    assert_eq!(
        request.header("webhook-id"),
        Some(format!("order-webhook-{job_id}").as_str())
    );
    let timestamp: i64 = request
        .header("webhook-timestamp")
        .expect("webhook-timestamp")
        .parse()
        .expect("Unix seconds");
    assert!(
        (timestamp - request.at.timestamp()).abs() <= 2,
        "sent at {timestamp}, received at {}",
        request.at
    );
    let signature = request
        .header("webhook-signature")
        .expect("webhook-signature");
    assert_eq!(signature.split(' ').count(), 2, "{signature}");
    assert!(
        signature.split(' ').all(|s| s.starts_with("v1,")),
        "{signature}"
    );
    let stranger = "whsec_c2VjcmV0LWtleS1ieXRlcw==";
    for secret in [old, new] {
        reference_verify(request, secret)
            .unwrap_or_else(|e| panic!("the reference verifier refused {secret}: {e}"));
    }
    let error =
        reference_verify(request, stranger).expect_err("a secret that signed nothing is refused");
    assert!(error.contains("signature"), "{error}");
    match [old, new, stranger].map(|secret| python_reference_verify(request, secret)) {
        [Some(old), Some(new), Some(stranger)] => {
            old.unwrap_or_else(|e| panic!("the Python verifier refused the old secret: {e}"));
            new.unwrap_or_else(|e| panic!("the Python verifier refused the new secret: {e}"));
            let error = stranger.expect_err("a secret that signed nothing is refused");
            assert!(error.contains("No matching signature"), "{error}");
        }
        _ => crate::support::optional_tool_missing(
            "the Python Standard Webhooks reference verifier (python3 with the standardwebhooks \
             package)",
            "python3 -m pip install standardwebhooks",
        ),
    }
    // Existing receivers: X-Signature keyed with the first secret as written.
    let mut mac = Hmac::<Sha256>::new_from_slice(old.as_bytes()).expect("HMAC key");
    mac.update(&request.body);
    let expected = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    assert_eq!(request.header("x-signature"), Some(expected.as_str()));
    assert_eq!(request.signature_valid, Some(true), "the demo sink agrees");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_410_gone_fails_the_job_after_one_attempt() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = HttpSink::start([], Answer::status(410).body("endpoint removed")).await;
    let (_, job_id) = place(&mut conn, 8);

    let relay = webhook_relay(&db, sender(&sink, Duration::from_secs(5)));
    wait_until("the webhook job failed", Duration::from_secs(20), || {
        count(&mut conn, "failed") == 1
    })
    .await;
    relay.stop().await;

    let job = job(&mut conn, job_id);
    assert_eq!(job.attempts, 1);
    assert_eq!(sink.requests().len(), 1);
    let error = job.last_error.expect("last_error");
    assert!(error.contains("410 Gone"), "{error}");
}

/// What the test's proxy saw of one request: its request line and its
/// `Proxy-Authorization`.
#[derive(Debug, Clone)]
struct Proxied {
    request_line: String,
    authorization: Option<String>,
}

/// A tiny HTTP proxy on port 0 that answers every request itself with 204
/// (standing in for the receiver it would forward to) and records it.
async fn counting_proxy() -> (
    std::net::SocketAddr,
    Arc<std::sync::Mutex<Vec<Proxied>>>,
    tokio::task::JoinHandle<()>,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind port 0");
    let addr = listener.local_addr().expect("address");
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let recorded = seen.clone();
    let handle = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let recorded = recorded.clone();
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                let mut chunk = [0_u8; 4096];
                let head_end = loop {
                    let Ok(n) = stream.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buffer.extend_from_slice(&chunk[..n]);
                    if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                        break at + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
                let header = |name: &str| {
                    head.lines().find_map(|line| {
                        let (key, value) = line.split_once(':')?;
                        key.eq_ignore_ascii_case(name)
                            .then(|| value.trim().to_owned())
                    })
                };
                let length: usize = header("content-length")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                while buffer.len() < head_end + length {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                    }
                }
                recorded.lock().expect("lock").push(Proxied {
                    request_line: head.lines().next().unwrap_or_default().to_owned(),
                    authorization: header("proxy-authorization"),
                });
                let _ = stream
                    .write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    (addr, seen, handle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_proxy_carries_the_calls_and_the_guard_still_checks_the_receiver() {
    use order_service::effects::webhook::{DeliveryOptions, Secrets};
    let (addr, seen, proxy) = counting_proxy().await;
    // The proxy is on loopback, yet private addresses stay refused for
    // receivers: the proxy is the operator's, the receivers are not.
    let proxy_url = url::Url::parse(&format!("http://relay:pr0xy-pw@{addr}")).expect("URL");
    let sender = WebhookSender::for_endpoints(&DeliveryOptions {
        timeout: Duration::from_secs(10),
        allow_private: false,
        proxy: Some(proxy_url),
    })
    .expect("sender");
    let secrets = Secrets::parse(SECRET).expect("secret");
    let body = br#"{"type":"order.placed"}"#.to_vec();

    // A public receiver: handed to the proxy, with the proxy's login.
    let public = url::Url::parse("http://1.1.1.1/hooks/shop").expect("URL");
    let outcome = sender.post_to(&public, &secrets, 41, body.clone()).await;
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    assert_eq!(outcome.status, Some(204));
    {
        let seen = seen.lock().expect("lock");
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(
            seen[0].request_line,
            "POST http://1.1.1.1/hooks/shop HTTP/1.1"
        );
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("relay:pr0xy-pw")
        );
        assert_eq!(seen[0].authorization.as_deref(), Some(expected.as_str()));
    }

    // Private receivers, as a literal and as a name that resolves to one:
    // refused before the proxy is asked, so it sees nothing more.
    for target in [
        "http://127.0.0.1:9/hook",
        "http://10.1.2.3/hook",
        "http://localhost:9/hook",
    ] {
        let url = url::Url::parse(target).expect("URL");
        let outcome = sender.post_to(&url, &secrets, 42, body.clone()).await;
        let error = outcome.result.expect_err("refused");
        assert!(
            error.to_string().contains("WEBHOOK_ALLOW_PRIVATE"),
            "{target}: {error}"
        );
        assert!(outcome.status.is_none());
    }
    assert_eq!(seen.lock().expect("lock").len(), 1);
    proxy.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_forms_of_a_private_ipv4_address_are_refused_before_any_call() {
    use order_service::effects::webhook::{DeliveryOptions, Secrets};
    // Through a proxy, so that an address let through is seen by the proxy
    // (which answers for it) rather than routed by this machine.
    let (addr, seen, proxy) = counting_proxy().await;
    let proxy_url = url::Url::parse(&format!("http://{addr}")).expect("URL");
    let sender = WebhookSender::for_endpoints(&DeliveryOptions {
        timeout: Duration::from_secs(10),
        allow_private: false,
        proxy: Some(proxy_url),
    })
    .expect("sender");
    let secrets = Secrets::parse(SECRET).expect("secret");
    let body = br#"{"type":"order.placed"}"#.to_vec();

    // 6to4, Teredo (client address inverted) and IPv4-compatible forms of
    // 127.0.0.1, 10.0.0.1 and 169.254.169.254.
    for target in [
        "http://[2002:7f00:1::1]/hook",
        "http://[2002:a9fe:a9fe::1]/latest/meta-data",
        "http://[2001:0:5db8:d822::80ff:fffe]/hook",
        "http://[2001:0:5db8:d822::f5ff:fffe]/hook",
        "http://[::127.0.0.1]/hook",
        "http://[::a00:1]/hook",
    ] {
        let url = url::Url::parse(target).expect("URL");
        let outcome = sender.post_to(&url, &secrets, 51, body.clone()).await;
        let error = outcome.result.expect_err("refused");
        assert!(
            error.to_string().contains("WEBHOOK_ALLOW_PRIVATE"),
            "{target}: {error}"
        );
        assert!(outcome.status.is_none(), "{target}");
    }
    assert!(
        seen.lock().expect("lock").is_empty(),
        "none reached the proxy"
    );

    // The same forms of a public address go out.
    for target in [
        "http://[2002:5db8:d822::1]/hook",
        "http://[2001:0:5db8:d822::a247:27dd]/hook",
        "http://[::5db8:d822]/hook",
    ] {
        let url = url::Url::parse(target).expect("URL");
        let outcome = sender.post_to(&url, &secrets, 52, body.clone()).await;
        assert!(outcome.result.is_ok(), "{target}: {:?}", outcome.result);
        assert_eq!(outcome.status, Some(204), "{target}");
    }
    let seen = seen.lock().expect("lock");
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(
        seen[0].request_line,
        "POST http://[2002:5db8:d822::1]/hook HTTP/1.1"
    );
    proxy.abort();
}
