//! order_publish against the real JetStream on 127.0.0.1:4222 (`.ci/run`
//! starts it): each test has a stream and a subject prefix of its own,
//! deleted at the end; the outage and credential tests run private servers
//! on free ports, so that the machine's server is never stopped.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use async_nats::jetstream::{self, message::StreamMessage};
use diesel::prelude::*;
use order_service::orders::OrderId;
use order_service::orders::jobs::{OrderPublish, order_enqueuer};
use order_service::orders::{Transition, transition_order};
use order_service::schema::{endpoints, jobs_all, order_events};
use serde_json::json;

use crate::faults::place_orders;
use crate::support::process::{BinProcess, Launch};
use crate::support::{TestDb, wait_until};

pub(crate) const NATS_URL: &str = "nats://127.0.0.1:4222";
pub(crate) const MINUTE: Duration = Duration::from_secs(60);

/// A stream of the test's own, capturing `<prefix>.>`; deleted on drop.
pub(crate) struct TestStream {
    url: String,
    pub(crate) name: String,
    pub(crate) prefix: String,
    js: jetstream::Context,
}

impl TestStream {
    pub(crate) async fn new(url: &str, duplicate_window: Duration) -> TestStream {
        TestStream::with_config(url, |config| config.duplicate_window = duplicate_window).await
    }

    /// A stream whose configuration `edit` adjusts.
    async fn with_config(
        url: &str,
        edit: impl FnOnce(&mut jetstream::stream::Config),
    ) -> TestStream {
        let tag = format!("{}_{:08x}", std::process::id(), fastrand::u32(..));
        let client = async_nats::connect(url).await.expect("connect to NATS");
        let js = jetstream::new(client);
        let (name, prefix) = (format!("T_{tag}"), format!("t{tag}"));
        let mut config = jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![format!("{prefix}.>")],
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        };
        edit(&mut config);
        js.create_stream(config)
            .await
            .expect("create the test's stream");
        TestStream {
            url: url.to_owned(),
            name,
            prefix,
            js,
        }
    }

    /// Creates the stream again after a test deleted it.
    async fn create_again(&self) {
        self.js
            .create_stream(jetstream::stream::Config {
                name: self.name.clone(),
                subjects: vec![format!("{}.>", self.prefix)],
                duplicate_window: Duration::from_secs(120),
                ..Default::default()
            })
            .await
            .expect("create the stream again");
    }

    /// Every message in the stream, by sequence.
    pub(crate) async fn messages(&self) -> Vec<StreamMessage> {
        let mut stream = self.js.get_stream(&self.name).await.expect("the stream");
        let state = stream.info().await.expect("stream info").state.clone();
        let mut messages = Vec::new();
        for seq in state.first_sequence..=state.last_sequence {
            if state.messages == 0 {
                break;
            }
            if let Ok(message) = stream.get_raw_message(seq).await {
                messages.push(message);
            }
        }
        messages
    }
}

impl Drop for TestStream {
    fn drop(&mut self) {
        let (url, name) = (self.url.clone(), self.name.clone());
        // Drop cannot await: delete from a thread with a runtime of its own.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                if let Ok(client) = async_nats::connect(url).await {
                    let _ = jetstream::new(client).delete_stream(&name).await;
                }
            });
        })
        .join();
    }
}

/// A `nats://` endpoint row, written directly (`endpoints add` would refuse
/// the short duplicate windows some tests need).
/// Whether the machine's JetStream answers on 127.0.0.1:4222. Where it does
/// not, the test prints one line naming what to install and passes as
/// skipped, as the browser tests do; with `CI=true` that is a failure.
pub(crate) fn shared_nats_answers() -> bool {
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], 4222));
    if std::net::TcpStream::connect_timeout(&address, Duration::from_millis(300)).is_ok() {
        return true;
    }
    skip_without_nats(
        "nothing answers on 127.0.0.1:4222 (Debian: apt-get install nats-server, then nats-server -js)",
    )
}

/// Whether `nats-server` is installed, for the tests that start their own.
pub(crate) fn nats_server_installed() -> bool {
    if Command::new("nats-server")
        .arg("--version")
        .output()
        .is_ok()
    {
        return true;
    }
    skip_without_nats("nats-server is not installed (Debian: apt-get install nats-server)")
}

fn skip_without_nats(missing: &str) -> bool {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{missing}: with CI=true the NATS tests must run"
    );
    // Straight to stderr, past the test harness's capture, which would hide
    // it for a test that passes.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: this NATS test did not run: {missing}"
    );
    false
}

pub(crate) fn add_endpoint(conn: &mut PgConnection, url: &str, stream: &TestStream) -> i64 {
    diesel::insert_into(endpoints::table)
        .values((
            endpoints::name.eq(format!("events-{}", stream.prefix)),
            endpoints::url.eq(url),
            endpoints::secret.eq("unused"),
            endpoints::stream.eq(&stream.name),
            endpoints::subject_prefix.eq(&stream.prefix),
            // The test servers speak plaintext: the endpoint's opt-in.
            endpoints::allow_http.eq(true),
        ))
        .returning(endpoints::id)
        .get_result(conn)
        .expect("add the endpoint")
}

pub(crate) fn pay(conn: &mut PgConnection, order_id: i64) {
    let transition = Transition::parse(
        "pay",
        &json!({"payment_reference": format!("pi_{order_id}")}),
    )
    .expect("a valid transition");
    transition_order(conn, &order_enqueuer(), order_id, &transition, None, 100).expect("pay");
}

/// The order_publish jobs the fan-out enqueued for `order_ids`, checked to
/// be one per event of each order, to `endpoint_id`, under the deliveries'
/// ordering key; how many there are.
pub(crate) fn enqueue_publishes(
    conn: &mut PgConnection,
    endpoint_id: i64,
    order_ids: &[i64],
) -> usize {
    let mut count = 0;
    for &order_id in order_ids {
        let events: Vec<i64> = order_events::table
            .filter(order_events::order_id.eq(order_id))
            .order(order_events::seq)
            .select(order_events::id)
            .load(conn)
            .expect("events");
        let queued: Vec<(serde_json::Value, Option<String>)> = jobs_all::table
            .filter(jobs_all::kind.eq("order_publish"))
            .filter(jobs_all::order_id.eq(order_id))
            .order(jobs_all::id)
            .select((jobs_all::payload, jobs_all::ordering_key))
            .load(conn)
            .expect("publish jobs");
        let expected: Vec<(serde_json::Value, Option<String>)> = events
            .iter()
            .map(|&event_id| {
                let job = OrderPublish {
                    order_id: OrderId::new(order_id),
                    event_id,
                    endpoint_id,
                };
                let key = job.ordering_key();
                (serde_json::to_value(job).expect("args"), Some(key))
            })
            .collect();
        assert_eq!(
            queued, expected,
            "the fan-out's publishes of order {order_id}"
        );
        count += queued.len();
    }
    count
}

/// (status, last_error) of every order_publish job, by id.
pub(crate) fn publish_jobs(conn: &mut PgConnection) -> Vec<(i64, String, Option<String>, i32)> {
    jobs_all::table
        .filter(jobs_all::kind.eq("order_publish"))
        .order(jobs_all::id)
        .select((
            jobs_all::id,
            jobs_all::status,
            jobs_all::last_error,
            jobs_all::attempts,
        ))
        .load(conn)
        .expect("jobs")
}

fn done_publishes(conn: &mut PgConnection) -> usize {
    let done: i64 = jobs_all::table
        .filter(jobs_all::kind.eq("order_publish"))
        .filter(jobs_all::status.eq("done"))
        .count()
        .get_result(conn)
        .expect("count done publishes");
    usize::try_from(done).unwrap_or(0)
}

pub(crate) fn all_done(conn: &mut PgConnection) -> bool {
    publish_jobs(conn)
        .iter()
        .all(|(_, status, _, _)| status == "done")
}

fn webhooks_pending(conn: &mut PgConnection) -> i64 {
    jobs_all::table
        .filter(jobs_all::kind.eq("order_webhook"))
        .filter(jobs_all::status.ne("done"))
        .count()
        .get_result(conn)
        .expect("count webhooks")
}

pub(crate) fn relay(name: &str, db: &TestDb) -> Launch {
    Launch::relay(name, &db.url).env("RELAY_KINDS", "order_publish")
}

fn header(message: &StreamMessage, name: &str) -> Option<String> {
    message.headers.get(name).map(ToString::to_string)
}

/// Exactly one message per job: by subject and by Nats-Msg-Id, each the
/// job's own; and per order, subjects in event order.
fn assert_once_each_in_order(
    conn: &mut PgConnection,
    stream: &TestStream,
    messages: &[StreamMessage],
    jobs: usize,
) {
    let mut by_subject: HashMap<String, usize> = HashMap::new();
    let mut by_id: HashMap<String, usize> = HashMap::new();
    let mut per_order: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for message in messages {
        *by_subject.entry(message.subject.to_string()).or_default() += 1;
        let id = header(message, "Nats-Msg-Id").expect("Nats-Msg-Id");
        *by_id.entry(id).or_default() += 1;
        let body: serde_json::Value = serde_json::from_slice(&message.payload).expect("JSON");
        let order_id = body["data"]["order"]["id"].as_i64().expect("order id");
        per_order
            .entry(order_id)
            .or_default()
            .push(body["data"]["seq"].as_i64().expect("seq"));
    }
    assert_eq!(
        messages.len(),
        jobs,
        "one message per event in {}",
        stream.name
    );
    assert!(by_subject.values().all(|n| *n == 1), "a subject twice");
    assert!(by_id.values().all(|n| *n == 1), "a Nats-Msg-Id twice");
    for (order_id, seqs) in &per_order {
        let mut sorted = seqs.clone();
        sorted.sort_unstable();
        assert_eq!(seqs, &sorted, "events of order {order_id} out of order");
    }
    for (job_id, status, _, _) in publish_jobs(conn) {
        assert_eq!(status, "done", "job {job_id}");
        assert_eq!(
            by_id.get(&format!("order-webhook-{job_id}")),
            Some(&1),
            "the message of job {job_id}"
        );
    }
}

#[tokio::test]
async fn each_event_is_published_once_to_its_subject_with_the_webhook_body_and_headers() {
    if !shared_nats_answers() {
        return;
    }
    let db = TestDb::new();
    let mut conn = db.conn();
    let stream = TestStream::new(NATS_URL, Duration::from_secs(120)).await;
    let endpoint = add_endpoint(&mut conn, NATS_URL, &stream);
    let orders = place_orders(&mut conn, 3, 100);
    for &order in &orders {
        pay(&mut conn, order);
    }
    let jobs = enqueue_publishes(&mut conn, endpoint, &orders);

    let (mut relay, metrics) = BinProcess::start_relay(relay("nats-basic", &db)).await;
    wait_until("every publish done", MINUTE, || all_done(&mut conn)).await;
    let messages = stream.messages().await;
    assert_once_each_in_order(&mut conn, &stream, &messages, jobs);

    let placed = format!("{}.placed.{}", stream.prefix, orders[0]);
    let first = messages
        .iter()
        .find(|m| m.subject.as_str() == placed)
        .expect("order.placed of the first order, on its subject");
    assert_eq!(
        header(first, "content-type").as_deref(),
        Some("application/json")
    );
    let body: serde_json::Value = serde_json::from_slice(&first.payload).expect("JSON");
    assert_eq!(body["type"], "order.placed");
    assert_eq!(
        body["order"]["id"], orders[0],
        "the webhook's body, order.placed fields kept"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.subject.as_str() == format!("{}.paid.{}", stream.prefix, orders[2]))
    );

    let client = crate::support::app::http_client();
    let ready = client
        .get(format!("{metrics}/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200);
    let ready: serde_json::Value = ready.json().await.expect("JSON");
    assert_eq!(ready["nats"][NATS_URL], "connected", "{ready}");
    let text = client
        .get(format!("{metrics}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let name = format!("events-{}", stream.prefix);
    let published = crate::support::metric(
        &text,
        "outbox_nats_publishes_total",
        &[("endpoint", name.as_str()), ("outcome", "published")],
    );
    assert!((published - jobs as f64).abs() < 0.5, "{text}");
    relay.terminate().await;
}

#[tokio::test]
async fn exactly_once_while_each_relay_is_killed_mid_publish() {
    // It loads the machine and bounds no time: beside one other such test.
    let _loud = crate::support::seats::loud();
    if !shared_nats_answers() {
        return;
    }
    // 1,000 orders, one event each (order.placed): several events per order
    // under faults is the outage test's. A life recorded up to 330 publishes
    // between its first and the kill (eight runs alone), and with 300 orders
    // one life now and then published them all: too few kills to test.
    const ORDERS: usize = 1000;
    let db = TestDb::new();
    let mut conn = db.conn();
    let stream = TestStream::new(NATS_URL, Duration::from_secs(120)).await;
    let endpoint = add_endpoint(&mut conn, NATS_URL, &stream);
    let orders = place_orders(&mut conn, ORDERS, 100);
    let jobs = enqueue_publishes(&mut conn, endpoint, &orders);

    let deadline = std::time::Instant::now() + Duration::from_secs(45);
    let mut kills = 0;
    let mut done = 0;
    // Publishes recorded in each life, to show how the work fell.
    let mut lives = Vec::new();
    while done < jobs {
        assert!(
            std::time::Instant::now() < deadline,
            "not done after 45s of kills ({done} of {jobs})"
        );
        // Concurrency 16, below the default: at 64 a relay can publish all 300
        // within two lives, and this test is about many kills, not a fast
        // drain.
        let name = format!("nats-crash-{kills}");
        let mut relay = relay(&name, &db)
            .env("RELAY_LEASE", "1s")
            .env("RELAY_CONCURRENCY", "16")
            .spawn();
        relay
            .wait_for_line("relay started", Duration::from_secs(30))
            .await;
        // Killed once it has recorded publishes of its own, so that every
        // life has done work (on a loaded machine a fixed time from its start
        // may pass before its first publish), and up to 100 ms
        // later, so that the kill meets its other publishes anywhere between
        // the send, the PubAck and the outcome's commit.
        let before = done;
        wait_until("the relay's first publishes recorded", MINUTE, || {
            done = done_publishes(&mut conn);
            done > before
        })
        .await;
        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..100))).await;
        relay.sigkill();
        kills += 1;
        relay.wait_exit(MINUTE).await;
        done = done_publishes(&mut conn);
        lives.push(done - before);
    }
    let messages = stream.messages().await;
    assert_once_each_in_order(&mut conn, &stream, &messages, jobs);
    eprintln!(
        "{jobs} publishes done, exactly once, across {kills} SIGKILLed relays \
         (recorded per life: {lives:?})"
    );
    assert!(
        kills >= 3,
        "the relay was killed {kills} times (recorded per life: {lives:?})"
    );
}

#[tokio::test]
async fn a_publish_acked_but_never_recorded_is_not_repeated_after_the_duplicate_window() {
    if !shared_nats_answers() {
        return;
    }
    let db = TestDb::new();
    let mut conn = db.conn();
    let stream = TestStream::new(NATS_URL, Duration::from_secs(1)).await;
    let endpoint = add_endpoint(&mut conn, NATS_URL, &stream);
    let orders = place_orders(&mut conn, 1, 100);
    let jobs = enqueue_publishes(&mut conn, endpoint, &orders);

    // The crash between the PubAck and the outcome's commit, made from
    // outside: the relay reaches NATS through a proxy that, on the first
    // PubAck of this stream, stops forwarding and tells the test, which
    // SIGKILLs the relay. The stream has the message; the relay never learnt.
    let nats: std::net::SocketAddr = "127.0.0.1:4222".parse().expect("address");
    let (ack_proxy, ack_seen) = AckTrap::start(nats, &stream.name).await;
    diesel::update(endpoints::table.find(endpoint))
        .set(endpoints::url.eq(format!("nats://127.0.0.1:{}", ack_proxy.port)))
        .execute(&mut conn)
        .expect("point the endpoint at the proxy");
    let mut crashing = relay("nats-killed-at-ack", &db).spawn();
    tokio::time::timeout(MINUTE, ack_seen)
        .await
        .expect("a PubAck within a minute")
        .expect("the proxy saw the PubAck");
    crashing.sigkill();
    let status = crashing.wait_exit(MINUTE).await;
    assert_eq!(
        status.code(),
        None,
        "killed by a signal: {}",
        crashing.stderr()
    );
    assert_eq!(stream.messages().await.len(), 1, "the ack came");
    assert_eq!(
        publish_jobs(&mut conn)[0].1,
        "processing",
        "the outcome was never written"
    );
    drop(ack_proxy);
    diesel::update(endpoints::table.find(endpoint))
        .set(endpoints::url.eq(NATS_URL))
        .execute(&mut conn)
        .expect("point the endpoint at NATS again");

    // Past the 1 s window (the server forgets ids on a timer, so give it
    // twice that); the 2 s lease also runs out meanwhile.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (mut relay, _) = BinProcess::start_relay(relay("nats-after-window", &db)).await;
    wait_until("the retried publish done", MINUTE, || all_done(&mut conn)).await;
    let messages = stream.messages().await;
    assert_once_each_in_order(&mut conn, &stream, &messages, jobs);
    relay
        .wait_for_line("outcome=\"already_published\"", Duration::from_secs(5))
        .await;
    relay.terminate().await;
}

#[tokio::test]
async fn a_deleted_stream_holds_its_publishes_until_it_is_created_again() {
    if !shared_nats_answers() {
        return;
    }
    let db = TestDb::new();
    let mut conn = db.conn();
    let stream = TestStream::new(NATS_URL, Duration::from_secs(120)).await;
    let endpoint = add_endpoint(&mut conn, NATS_URL, &stream);
    let orders = place_orders(&mut conn, 2, 100);
    for &order in &orders {
        pay(&mut conn, order);
    }
    let jobs = enqueue_publishes(&mut conn, endpoint, &orders);
    stream.js.delete_stream(&stream.name).await.expect("delete");

    let (mut relay, _) = BinProcess::start_relay(relay("nats-deleted", &db)).await;
    let retried = |conn: &mut PgConnection| {
        publish_jobs(conn)
            .into_iter()
            .find_map(|(_, status, error, _)| {
                error.filter(|e| status == "pending" && e.contains("does not exist"))
            })
    };
    // The error as that read saw it: read again, the job may have been
    // claimed for its next try meanwhile (processing, not pending), and the
    // asserts below would then read an empty error.
    let mut seen = None;
    wait_until("a publish waiting for the deleted stream", MINUTE, || {
        seen = retried(&mut conn);
        seen.is_some()
    })
    .await;
    let error = seen.unwrap_or_default();
    for said in [
        "will retry: retryable: NATS endpoint \"events-",
        &format!("(stream {})", stream.name),
        "does not exist",
        "retried until the stream is created again",
    ] {
        assert!(error.contains(said), "{said:?} in {error}");
    }
    let held = publish_jobs(&mut conn);
    assert!(
        held.iter()
            .all(|(_, status, _, _)| status == "pending" || status == "processing"),
        "nothing failed, nothing published: {held:?}"
    );

    stream.create_again().await;
    wait_until("every publish done once the stream is back", MINUTE, || {
        all_done(&mut conn)
    })
    .await;
    let messages = stream.messages().await;
    assert_once_each_in_order(&mut conn, &stream, &messages, jobs);
    relay.terminate().await;
}

/// The `last_error` of the only failed publish job, once there is one.
async fn failed_publish(conn: &mut PgConnection) -> String {
    wait_until("a publish failed", MINUTE, || {
        publish_jobs(conn)
            .iter()
            .any(|(_, status, _, _)| status == "failed")
    })
    .await;
    let failed: Vec<String> = publish_jobs(conn)
        .into_iter()
        .filter(|(_, status, _, _)| status == "failed")
        .map(|(_, _, error, _)| error.unwrap_or_default())
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    failed.into_iter().next().unwrap_or_default()
}

/// The publish jobs of one claim read their orders together: an order that
/// does not decode (a currency the service no longer knows; the column's
/// CHECK takes any three capitals) fails its own job at once, saying which
/// order and which value, and the others of its batch are published.
#[tokio::test]
async fn an_unreadable_order_fails_only_its_own_publish_saying_why() {
    if !shared_nats_answers() {
        return;
    }
    let db = TestDb::new();
    let mut conn = db.conn();
    let stream = TestStream::new(NATS_URL, Duration::from_secs(120)).await;
    let endpoint = add_endpoint(&mut conn, NATS_URL, &stream);
    let orders = place_orders(&mut conn, 6, 100);
    let jobs = enqueue_publishes(&mut conn, endpoint, &orders);
    let bad = orders[2];
    diesel::sql_query("UPDATE orders SET currency = 'XYZ' WHERE id = $1")
        .bind::<diesel::sql_types::BigInt, _>(bad)
        .execute(&mut conn)
        .expect("an unknown code");

    // One claim takes every job (the default batch is 16): they are loaded
    // together.
    let (mut relay, _) = BinProcess::start_relay(relay("nats-unreadable", &db)).await;
    let error = failed_publish(&mut conn).await;
    wait_until("the other publishes done", MINUTE, || {
        publish_jobs(&mut conn)
            .iter()
            .filter(|(_, status, _, _)| status == "done")
            .count()
            == jobs - 1
    })
    .await;
    for said in [
        "permanent error on attempt 1",
        &format!("order {bad} cannot be read"),
        "\"XYZ\"",
    ] {
        assert!(error.contains(said), "{said:?} in {error}");
    }
    for (job_id, status, last_error, attempts) in publish_jobs(&mut conn) {
        if status == "done" {
            assert_eq!(attempts, 1, "job {job_id} retried: {last_error:?}");
        }
    }
    let messages = stream.messages().await;
    assert_eq!(messages.len(), jobs - 1);
    assert!(
        !messages
            .iter()
            .any(|m| m.subject.as_str() == format!("{}.placed.{bad}", stream.prefix)),
        "nothing published for the unreadable order"
    );
    relay.terminate().await;
}

#[tokio::test]
async fn a_message_over_the_streams_max_msg_size_fails_permanently_saying_so() {
    if !shared_nats_answers() {
        return;
    }
    let db = TestDb::new();
    let mut conn = db.conn();
    let stream = TestStream::with_config(NATS_URL, |config| config.max_message_size = 64).await;
    let endpoint = add_endpoint(&mut conn, NATS_URL, &stream);
    let orders = place_orders(&mut conn, 1, 100);
    enqueue_publishes(&mut conn, endpoint, &orders);

    let (mut relay, _) = BinProcess::start_relay(relay("nats-too-large", &db)).await;
    let error = failed_publish(&mut conn).await;
    for said in [
        "permanent error on attempt 1: permanent: NATS endpoint \"events-",
        &format!("(stream {})", stream.name),
        "larger than the stream's max_msg_size",
    ] {
        assert!(error.contains(said), "{said:?} in {error}");
    }
    assert!(stream.messages().await.is_empty(), "nothing stored");
    relay.terminate().await;
}

#[tokio::test]
async fn a_publish_the_server_does_not_permit_fails_permanently_saying_so() {
    if !nats_server_installed() {
        return;
    }
    // The server binds connections without credentials to a user of a
    // JetStream account who may publish anything but an order.paid event.
    // (async-nats ignores a user and password in the URL, and a credentials
    // file needs an operator's signed JWTs: the refusal is the same.)
    let config = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("nats-permissions-{:08x}.conf", fastrand::u32(..)));
    std::fs::write(
        &config,
        r#"accounts {
  SHOP {
    jetstream: enabled
    users: [
      { user: relay, password: relay, permissions: { publish: { deny: ["*.paid.>"] } } }
    ]
  }
}
no_auth_user: relay
"#,
    )
    .expect("write the server's configuration");
    let server = PrivateNats::start(&["-c", &config.to_string_lossy()]);
    let url = server.url();
    let stream = TestStream::new(&url, Duration::from_secs(120)).await;
    let db = TestDb::new();
    let mut conn = db.conn();
    let endpoint = add_endpoint(&mut conn, &url, &stream);
    let orders = place_orders(&mut conn, 1, 100);
    pay(&mut conn, orders[0]);
    enqueue_publishes(&mut conn, endpoint, &orders);

    let (mut relay, _) = BinProcess::start_relay(relay("nats-denied", &db)).await;
    let error = failed_publish(&mut conn).await;
    for said in [
        "permanent error on attempt 1: permanent: NATS endpoint \"events-",
        &format!("(stream {})", stream.name),
        "the server refused to let these credentials publish",
        &format!("{}.paid.{}", stream.prefix, orders[0]),
    ] {
        assert!(error.contains(said), "{said:?} in {error}");
    }
    let messages = stream.messages().await;
    let subjects: Vec<&str> = messages.iter().map(|m| m.subject.as_str()).collect();
    assert_eq!(
        subjects,
        [format!("{}.placed.{}", stream.prefix, orders[0])],
        "the permitted event got in"
    );
    relay.terminate().await;
    drop(stream);
    drop(server);
    let _ = std::fs::remove_file(&config);
}

/// A `nats-server -js` of the test's own on a free port, its store in a
/// temporary directory that outlives restarts.
pub(crate) struct PrivateNats {
    port: u16,
    dir: std::path::PathBuf,
    args: Vec<String>,
    child: Option<Child>,
}

impl PrivateNats {
    pub(crate) fn start(extra: &[&str]) -> PrivateNats {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("nats-{port}-{:08x}", fastrand::u32(..)));
        std::fs::create_dir_all(&dir).expect("store directory");
        let mut server = PrivateNats {
            port,
            dir,
            args: extra.iter().map(|a| (*a).to_owned()).collect(),
            child: None,
        };
        server.resume();
        server
    }

    pub(crate) fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn resume(&mut self) {
        let child = Command::new("nats-server")
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(&self.dir)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server (Debian's package nats-server)");
        self.child = Some(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "nats-server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateNats {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn every_event_arrives_once_and_in_order_across_a_10s_nats_outage() {
    if !nats_server_installed() {
        return;
    }
    let mut server = PrivateNats::start(&[]);
    let url = server.url();
    let db = TestDb::new();
    let mut conn = db.conn();
    let stream = TestStream::new(&url, Duration::from_secs(120)).await;
    let endpoint = add_endpoint(&mut conn, &url, &stream);
    // A webhook endpoint beside it, subscribed before the orders are placed
    // so that the fan-out gives each event a webhook too.
    let receiver =
        crate::support::http::HttpSink::start([], crate::support::http::Answer::status(200)).await;
    crate::endpoint_delivery::add_endpoint(&mut conn, "hooks", &receiver, None, 4);
    let orders = place_orders(&mut conn, 20, 100);
    for &order in &orders {
        pay(&mut conn, order);
    }

    // Down before the first publish: every order's first attempt fails.
    server.stop();
    let jobs = enqueue_publishes(&mut conn, endpoint, &orders);
    let launch = relay("nats-outage", &db)
        .env("RELAY_KINDS", "order_publish,order_webhook")
        .env("WEBHOOK_URL", receiver.url().as_str())
        .env("WEBHOOK_SECRET", crate::faults::WEBHOOK_SECRET);
    let (mut relay, metrics) = BinProcess::start_relay(launch).await;
    let client = crate::support::app::http_client();
    wait_until("a publish failed and waits for a retry", MINUTE, || {
        publish_jobs(&mut conn).iter().any(|(_, _, error, _)| {
            error
                .as_deref()
                .is_some_and(|e| e.contains("will retry: retryable: NATS endpoint"))
        })
    })
    .await;
    let ready = client
        .get(format!("{metrics}/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 503, "NATS is down");
    let outage = std::time::Instant::now();
    wait_until(
        "every webhook delivered while NATS is down",
        Duration::from_secs(10),
        || webhooks_pending(&mut conn) == 0,
    )
    .await;
    eprintln!(
        "{} webhooks delivered {:?} into the NATS outage",
        receiver.requests().len(),
        outage.elapsed()
    );
    // Not held up: every webhook went through on its first attempt, while
    // the publishes were failing (above: all within the outage).
    let webhooks: Vec<(i32, String)> = jobs_all::table
        .filter(jobs_all::kind.eq("order_webhook"))
        .select((jobs_all::attempts, jobs_all::status))
        .load(&mut conn)
        .expect("the webhooks");
    assert_eq!(webhooks.len(), 40, "two events of 20 orders");
    assert!(
        webhooks
            .iter()
            .all(|(attempts, status)| *attempts == 1 && status == "done"),
        "{webhooks:?}"
    );
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(outage.elapsed())).await;
    assert!(
        publish_jobs(&mut conn)
            .iter()
            .all(|(_, status, _, _)| status != "done"),
        "nothing can be published while NATS is down"
    );

    server.resume();
    wait_until("every publish done after the outage", MINUTE, || {
        all_done(&mut conn)
    })
    .await;
    let messages = stream.messages().await;
    assert_once_each_in_order(&mut conn, &stream, &messages, jobs);
    // Per order: its first publish (order.placed) failed while NATS was
    // down and was retried, and its later event still came after it.
    let mut retried_first = 0;
    for &order in &orders {
        let attempts: Vec<i32> = jobs_all::table
            .filter(jobs_all::kind.eq("order_publish"))
            .filter(jobs_all::order_id.eq(order))
            .order(jobs_all::id)
            .select(jobs_all::attempts)
            .load(&mut conn)
            .expect("the order's publishes");
        if attempts.first().is_some_and(|a| *a > 1) {
            retried_first += 1;
            let subjects: Vec<String> = messages
                .iter()
                .map(|m| m.subject.to_string())
                .filter(|s| s.ends_with(&format!(".{order}")))
                .collect();
            assert_eq!(
                subjects,
                [
                    format!("{}.placed.{order}", stream.prefix),
                    format!("{}.paid.{order}", stream.prefix)
                ],
                "order {order}, whose first publish was retried"
            );
        }
    }
    assert!(retried_first > 0, "no order's first publish was retried");
    let ready = client
        .get(format!("{metrics}/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200, "reconnected");
    relay.terminate().await;
    drop(stream);
}

fn endpoints_add(db: &TestDb, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(["endpoints", "add", "--name", "events"])
        .args(args)
        // The shared server speaks plaintext on 127.0.0.1: both opt-ins.
        .arg("--allow-http")
        .env("WEBHOOK_ALLOW_PRIVATE", "true")
        .env("DATABASE_URL", &db.url)
        .env_remove("NATS_CREDENTIALS")
        .output()
        .expect("run outbox-relay")
}

fn endpoint_rows(conn: &mut PgConnection) -> i64 {
    endpoints::table.count().get_result(conn).expect("count")
}

#[track_caller]
fn assert_refused(output: &Output, said: &[&str]) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    for needle in said {
        assert!(stderr.contains(needle), "{needle:?} in {stderr}");
    }
}

#[tokio::test]
async fn endpoints_add_checks_the_stream_at_once_and_refuses_bad_nats_input() {
    if !shared_nats_answers() {
        return;
    }
    let db = TestDb::new();
    let mut conn = db.conn();
    let short = TestStream::new(NATS_URL, Duration::from_secs(1)).await;
    let tag = format!("{}_{:08x}", std::process::id(), fastrand::u32(..));
    let (stream, prefix) = (format!("C_{tag}"), format!("c{tag}"));
    let closed_port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let down = format!("nats://127.0.0.1:{closed_port}");
    let mut auth = PrivateNats::start(&["--user", "relay", "--pass", "s3cret"]);
    let auth_url = auth.url();

    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec![
                "--url",
                NATS_URL,
                "--stream",
                &stream,
                "--subject-prefix",
                "my orders",
            ],
            vec!["--subject-prefix", "whitespace"],
        ),
        (
            vec![
                "--url",
                NATS_URL,
                "--stream",
                &stream,
                "--subject-prefix",
                "orders.*",
            ],
            vec!["--subject-prefix", "wildcard"],
        ),
        (
            vec![
                "--url",
                "nats://",
                "--stream",
                &stream,
                "--subject-prefix",
                &prefix,
            ],
            vec!["--url"],
        ),
        (
            vec!["--url", NATS_URL, "--subject-prefix", &prefix],
            vec!["--stream", "needs"],
        ),
        (
            vec!["--url", "https://erp.example.com/", "--stream", &stream],
            vec!["--stream", "nats:// endpoints only"],
        ),
        (
            vec![
                "--url",
                NATS_URL,
                "--stream",
                &stream,
                "--subject-prefix",
                &prefix,
            ],
            vec![
                "endpoint \"events\"",
                "--stream",
                "no stream named",
                "--create-stream",
            ],
        ),
        (
            vec![
                "--url",
                &down,
                "--stream",
                &stream,
                "--subject-prefix",
                &prefix,
            ],
            vec!["endpoint \"events\"", "cannot connect"],
        ),
        (
            vec![
                "--url",
                &auth_url,
                "--stream",
                &stream,
                "--subject-prefix",
                &prefix,
            ],
            vec!["endpoint \"events\"", "refused the credentials"],
        ),
        (
            vec![
                "--url",
                NATS_URL,
                "--stream",
                &short.name,
                "--subject-prefix",
                &short.prefix,
            ],
            vec!["duplicate window is 1s, shorter than 1m", "Nats-Msg-Id"],
        ),
        (
            vec![
                "--url",
                NATS_URL,
                "--stream",
                &short.name,
                "--subject-prefix",
                &prefix,
            ],
            vec!["--subject-prefix", "not every subject under"],
        ),
    ];
    for (args, said) in &cases {
        let output = endpoints_add(&db, args);
        assert_refused(&output, said);
    }
    assert_eq!(endpoint_rows(&mut conn), 0, "nothing written on a refusal");
    auth.stop();

    let output = endpoints_add(
        &db,
        &[
            "--url",
            NATS_URL,
            "--stream",
            &stream,
            "--subject-prefix",
            &prefix,
            "--create-stream",
        ],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains(&format!("stream {stream} created")),
        "{stdout}"
    );
    let (db_stream, db_prefix): (Option<String>, Option<String>) = endpoints::table
        .select((endpoints::stream, endpoints::subject_prefix))
        .first(&mut conn)
        .expect("the endpoint");
    assert_eq!(
        (db_stream.as_deref(), db_prefix.as_deref()),
        (Some(stream.as_str()), Some(prefix.as_str()))
    );
    let client = async_nats::connect(NATS_URL).await.expect("connect");
    jetstream::new(client)
        .delete_stream(&stream)
        .await
        .expect("delete the created stream");
}

#[tokio::test]
async fn endpoints_add_refuses_a_plaintext_or_private_nats_server_without_its_opt_in() {
    if !shared_nats_answers() {
        return;
    }
    let db = TestDb::new();
    let mut conn = db.conn();
    let tag = format!("{}_{:08x}", std::process::id(), fastrand::u32(..));
    let (stream, prefix) = (format!("T_{tag}"), format!("t{tag}"));
    let add = |extra: &[&str], allow_private: &str| {
        Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
            .args(["endpoints", "add", "--name", "events", "--url", NATS_URL])
            .args(["--stream", &stream, "--subject-prefix", &prefix])
            .args(["--create-stream"])
            .args(extra)
            .env("DATABASE_URL", &db.url)
            .env("WEBHOOK_ALLOW_PRIVATE", allow_private)
            .env_remove("NATS_CREDENTIALS")
            .output()
            .expect("run outbox-relay")
    };
    // The shared server has no TLS: without --allow-http, TLS is required.
    assert_refused(&add(&[], "true"), &["endpoint \"events\"", "--allow-http"]);
    // It is on 127.0.0.1: refused like a webhook to a private address.
    assert_refused(
        &add(&["--allow-http"], "false"),
        &["endpoint \"events\"", "127.0.0.1", "WEBHOOK_ALLOW_PRIVATE"],
    );
    assert_eq!(endpoint_rows(&mut conn), 0, "nothing written on a refusal");
    let allowed = add(&["--allow-http"], "true");
    assert_eq!(
        allowed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&allowed.stderr)
    );
    let plaintext: bool = endpoints::table
        .select(endpoints::allow_http)
        .first(&mut conn)
        .expect("the endpoint");
    assert!(plaintext, "the opt-in is stored with the endpoint");
    let client = async_nats::connect(NATS_URL).await.expect("connect");
    jetstream::new(client)
        .delete_stream(&stream)
        .await
        .expect("delete the created stream");
}

/// A TCP proxy in front of NATS that withholds the first PubAck of one
/// stream: from then on nothing more reaches the client, and the returned
/// channel fires, so a test can kill the client between the stream's store
/// and the client's knowing of it.
struct AckTrap {
    port: u16,
    tasks: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl AckTrap {
    async fn start(
        target: std::net::SocketAddr,
        stream: &str,
    ) -> (AckTrap, tokio::sync::oneshot::Receiver<()>) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let tx = std::sync::Arc::new(std::sync::Mutex::new(Some(tx)));
        // A PubAck is a JSON body naming the stream and its sequence.
        let marker = format!("\"stream\":\"{stream}\"");
        let tasks: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>> =
            std::sync::Arc::default();
        let held = std::sync::Arc::clone(&tasks);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(target).await else {
                    continue;
                };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let up = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                });
                let (tx, marker) = (std::sync::Arc::clone(&tx), marker.clone());
                let down = tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = server_read.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        let chunk = String::from_utf8_lossy(&buf[..n]);
                        if chunk.contains(&marker) && chunk.contains("\"seq\":") {
                            if let Some(tx) = tx.lock().expect("trap state").take() {
                                let _ = tx.send(());
                            }
                            // Withheld, and the connection held open, so
                            // the client neither sees the ack nor an error.
                            std::future::pending::<()>().await;
                        }
                        if client_write.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
                let mut held = held.lock().expect("trap state");
                held.push(up.abort_handle());
                held.push(down.abort_handle());
            }
        });
        tasks
            .lock()
            .expect("trap state")
            .push(accept.abort_handle());
        (AckTrap { port, tasks }, rx)
    }
}

impl Drop for AckTrap {
    fn drop(&mut self) {
        if let Ok(tasks) = self.tasks.lock() {
            tasks.iter().for_each(tokio::task::AbortHandle::abort);
        }
    }
}
