//! The LISTEN connection over TLS, against the local server's own certificate
//! (Debian's snakeoil, `ssl = on`; `.ci/run` turns it on). With
//! `sslmode=require` a NOTIFY must wake a relay whose poll interval is 30s at
//! once; with `verify-full` and a certificate that does not pass, the relay
//! must say why and keep going by polling.
//!
//! A server without TLS fails these tests rather than skipping them: a relay
//! on a managed database always meets TLS, so CI must too.

use crate::support::enqueue;
use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Double, Text};
use order_service::outbox::NewJob;
use order_service::worker_pool::WorkerPool;

use crate::support::app::http_client;
use crate::support::process::{BinProcess, Launch};
use crate::support::{TestDb, executor, metric, test_settings, wait_until};

/// The certificate the local server presents (`ssl_cert_file`).
const SERVER_CERT: &str = "/etc/ssl/certs/ssl-cert-snakeoil.pem";

#[derive(QueryableByName)]
struct Setting {
    #[diesel(sql_type = Text)]
    ssl: String,
}

#[derive(QueryableByName)]
struct SslBackend {
    #[diesel(sql_type = Bool)]
    ssl: bool,
}

#[derive(QueryableByName)]
struct Latency {
    #[diesel(sql_type = Double)]
    ms: f64,
}

/// Whether the server speaks TLS: these tests prove nothing without it. A
/// server without TLS (the tests' private one, from initdb) skips them with
/// one line, as a missing browser does; with `CI=true` it is a failure
/// (`.ci/run` turns TLS on with the snakeoil certificate).
fn server_has_tls(conn: &mut PgConnection) -> bool {
    let ssl = diesel::sql_query("SELECT current_setting('ssl') AS ssl")
        .get_result::<Setting>(conn)
        .expect("read the ssl setting")
        .ssl;
    if ssl == "on" {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "PostgreSQL has ssl = off: these tests need TLS (.ci/run turns it on with the snakeoil certificate)"
    );
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: this TLS test did not run: PostgreSQL has ssl = off (set ssl = on with a certificate, as .ci/run does)"
    );
    false
}

/// `url` with `params` added to its query.
fn with_params(url: &str, params: &[(&str, &str)]) -> String {
    let mut url = url::Url::parse(url).expect("a database URL");
    url.query_pairs_mut().extend_pairs(params);
    url.to_string()
}

/// Whether the backend that last ran a LISTEN on `database` is encrypted.
fn listen_backend_uses_tls(conn: &mut PgConnection, database: &str) -> Option<bool> {
    diesel::sql_query(
        "SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
         WHERE a.datname = $1 AND a.query LIKE 'LISTEN %'",
    )
    .bind::<Text, _>(database)
    .get_result::<SslBackend>(conn)
    .optional()
    .expect("pg_stat_ssl")
    .map(|row| row.ssl)
}

async fn listener_gauge(base: &str) -> f64 {
    metric(&metrics_text(base).await, "outbox_listener_connected", &[])
}

async fn metrics_text(base: &str) -> String {
    http_client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text")
}

/// From the enqueue (its transaction's start) to the claim (the claim's
/// `locked_at`), on the server's clock, once the job is `done`.
async fn enqueue_to_claim(conn: &mut PgConnection) -> Duration {
    let id = conn
        .transaction(|conn| enqueue(conn, &NewJob::new("noop", serde_json::json!({}))))
        .expect("enqueue");
    wait_until("the job to be done", Duration::from_secs(20), || {
        done_jobs(conn, Some(id)) == 1
    })
    .await;
    let table = all_jobs(conn);
    let ms = diesel::sql_query(format!(
        "SELECT (EXTRACT(EPOCH FROM locked_at - created_at) * 1000)::float8 AS ms \
         FROM {table} WHERE id = $1"
    ))
    .bind::<BigInt, _>(id)
    .get_result::<Latency>(conn)
    .expect("job timestamps")
    .ms;
    Duration::from_secs_f64(ms.max(0.0) / 1000.0)
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[derive(QueryableByName)]
struct Relation {
    #[diesel(sql_type = Text)]
    name: String,
}

/// `jobs_all` (every job wherever it lives) once a migration makes it, else `jobs`.
fn all_jobs(conn: &mut PgConnection) -> String {
    diesel::sql_query(
        "SELECT CASE WHEN to_regclass('jobs_all') IS NULL THEN 'jobs' ELSE 'jobs_all' END AS name",
    )
    .get_result::<Relation>(conn)
    .expect("look up jobs_all")
    .name
}

/// `done` jobs (only job `id`, if given).
fn done_jobs(conn: &mut PgConnection, id: Option<i64>) -> i64 {
    let table = all_jobs(conn);
    diesel::sql_query(format!(
        "SELECT count(*) AS n FROM {table} WHERE status = 'done' AND ($1::bigint IS NULL OR id = $1)"
    ))
    .bind::<diesel::sql_types::Nullable<BigInt>, _>(id)
    .get_result::<Count>(conn)
    .expect("count done jobs")
    .n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_sslmode_require_a_notify_over_tls_wakes_a_relay_that_polls_every_30s() {
    let db = TestDb::new();
    let mut conn = db.conn();
    if !server_has_tls(&mut conn) {
        return;
    }
    let url = with_params(&db.url, &[("sslmode", "require")]);
    let (mut relay, base) = BinProcess::start_relay(
        Launch::relay("tls-require", &url)
            .args(&["--kinds", "noop"])
            .env(
                "RUST_LOG",
                "info,order_service::worker_pool::listener=debug",
            )
            .env("RELAY_POLL_INTERVAL", "30s"),
    )
    .await;

    let connected = Instant::now();
    while listener_gauge(&base).await != 1.0 {
        assert!(
            connected.elapsed() < Duration::from_secs(10),
            "outbox_listener_connected is not 1 after 10s; relay log:\n{}\nmetrics:\n{}",
            relay.stderr(),
            metrics_text(&base).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        listen_backend_uses_tls(&mut conn, &db.name),
        Some(true),
        "the LISTEN backend is encrypted (pg_stat_ssl)"
    );
    // Past the relay's first claim, which a probe job done proves: from here
    // only a NOTIFY or the 30s poll can start a job.
    enqueue_to_claim(&mut conn).await;

    let mut latencies = Vec::new();
    for _ in 0..5 {
        latencies.push(enqueue_to_claim(&mut conn).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let gauge = listener_gauge(&base).await;
    relay.terminate().await;

    eprintln!("enqueue-to-claim over a TLS LISTEN (poll interval 30s): {latencies:?}");
    let worst = latencies.iter().max().copied().unwrap_or_default();
    assert!(
        worst < Duration::from_secs(1),
        "a NOTIFY over TLS starts a job well before the 30s poll: {latencies:?}"
    );
    assert_eq!(gauge, 1.0, "the listener stayed connected");
    assert!(
        !relay.stderr().contains("cannot LISTEN"),
        "{}",
        relay.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_verify_ca_and_the_servers_own_certificate_as_root_the_relay_listens() {
    let db = TestDb::new();
    let mut conn = db.conn();
    if !server_has_tls(&mut conn) {
        return;
    }
    // libpq (the pool) checks the chain as strictly as the listener, so one
    // URL serves both. (verify-full would also need the name the certificate
    // was made for, which depends on the machine that made it.)
    let url = with_params(
        &db.url,
        &[("sslmode", "verify-ca"), ("sslrootcert", SERVER_CERT)],
    );
    let (mut relay, base) = BinProcess::start_relay(
        Launch::relay("tls-verify-ca", &url)
            .args(&["--kinds", "noop"])
            .env(
                "RUST_LOG",
                "info,order_service::worker_pool::listener=debug",
            )
            .env("RELAY_POLL_INTERVAL", "30s"),
    )
    .await;
    let connected = Instant::now();
    while listener_gauge(&base).await != 1.0 {
        assert!(
            connected.elapsed() < Duration::from_secs(10),
            "outbox_listener_connected is not 1 after 10s; relay log:\n{}\nmetrics:\n{}",
            relay.stderr(),
            metrics_text(&base).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A probe job first: the relay's first claim is behind it.
    enqueue_to_claim(&mut conn).await;
    let latency = enqueue_to_claim(&mut conn).await;
    relay.terminate().await;
    eprintln!("enqueue-to-claim over a verify-ca LISTEN: {latency:?}");
    assert!(latency < Duration::from_secs(1), "{latency:?}");
}

/// Log lines written by the relay, as a `MakeWriter`.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("lock")).into_owned()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

// In process, on one thread: the relay's tasks log to this test's subscriber,
// and its pool can use a URL libpq accepts while the listener gets the one
// that fails (with one URL, libpq would refuse the pool before any LISTEN).
#[tokio::test(flavor = "current_thread")]
async fn verify_full_against_a_certificate_for_another_name_says_why_and_the_relay_polls() {
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("order_service=info,outbox_core=info")
        .with_writer(logs.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let db = TestDb::new();
    let mut conn = db.conn();
    if !server_has_tls(&mut conn) {
        return;
    }
    // 127.0.0.1 is not the `localhost` the snakeoil certificate names.
    let listen_url = with_params(
        &db.url,
        &[("sslmode", "verify-full"), ("sslrootcert", SERVER_CERT)],
    );
    let mut settings = test_settings("tls-verify-fails", &["noop"]);
    settings.poll_interval = Duration::from_millis(200);
    let relay = WorkerPool::new(
        db.pool(8),
        listen_url,
        settings,
        executor(|_| async { Ok(None) }),
    )
    .expect("a relay");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(relay.run_until_stopped(shutdown.clone()));

    let logged = |needle: &str| logs.text().lines().any(|l| l.contains(needle));
    let started = Instant::now();
    while !logged("cannot LISTEN") {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no 'cannot LISTEN' warning within 10s; logs:\n{}",
            logs.text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in 0..3 {
        conn.transaction(|conn| enqueue(conn, &NewJob::new("noop", serde_json::json!({}))))
            .expect("enqueue");
    }
    let polled = Instant::now();
    while done_jobs(&mut conn, None) < 3 {
        assert!(
            polled.elapsed() < Duration::from_secs(10),
            "jobs did not run by polling; logs:\n{}",
            logs.text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Long enough for several reconnect attempts: still one warning.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    shutdown.cancel();
    running.await.expect("relay task did not panic");

    let text = logs.text();
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("cannot LISTEN"))
        .collect();
    eprintln!("{}", warnings.join("\n"));
    assert_eq!(warnings.len(), 1, "once per outage:\n{text}");
    let warning = warnings[0];
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains("sslmode=verify-full"), "{warning}");
    assert!(
        warning.contains("invalid peer certificate"),
        "the certificate error itself: {warning}"
    );
    assert!(!text.contains("panicked"), "{text}");
}

#[derive(QueryableByName)]
struct PlainListen {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Starts a relay in this process whose pool uses `url` and whose listener
/// uses `listen_url`; returns its shutdown token and task.
fn start_relay_listening_on(
    url: &str,
    listen_url: String,
    worker: &str,
) -> (
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let mut settings = test_settings(worker, &["noop"]);
    settings.poll_interval = Duration::from_millis(200);
    let relay = WorkerPool::new(
        order_service::db::build_pool(
            url,
            &order_service::db::PoolOptions {
                size: 6,
                ..Default::default()
            },
        ),
        listen_url,
        settings,
        executor(|_| async { Ok(None) }),
    )
    .expect("a relay");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(relay.run_until_stopped(shutdown.clone()));
    (shutdown, running)
}

// A private server (initdb's default: ssl = off) stands for a server without
// TLS: libpq's `require` refuses it, `prefer` goes on in plain.
#[tokio::test(flavor = "current_thread")]
async fn a_server_without_tls_is_refused_by_require_with_the_reason_and_used_in_plain_by_prefer() {
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("order_service=info,outbox_core=info")
        .with_writer(logs.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let server = outbox_dev_tools::private_pg::PrivatePostgres::start_temporary()
        .expect("a private PostgreSQL for this test");
    let url = server.url();
    order_service::db::migrate_url(&url).expect("migrate");
    let mut conn = PgConnection::establish(&url).expect("connect");
    let ssl = diesel::sql_query("SELECT current_setting('ssl') AS ssl")
        .get_result::<Setting>(&mut conn)
        .expect("read the ssl setting")
        .ssl;
    assert_eq!(ssl, "off", "the private server is the one without TLS");

    let (stop, running) = start_relay_listening_on(
        &url,
        with_params(&url, &[("sslmode", "require")]),
        "no-tls-require",
    );
    let started = Instant::now();
    while !logs.text().contains("cannot LISTEN") {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no 'cannot LISTEN' warning within 10s; logs:\n{}",
            logs.text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    running.await.expect("no panic");
    let text = logs.text();
    let warning = text
        .lines()
        .find(|l| l.contains("cannot LISTEN"))
        .unwrap_or_default()
        .to_owned();
    eprintln!("{warning}");
    assert!(warning.contains("sslmode=require"), "{warning}");
    assert!(warning.contains("server does not support TLS"), "{warning}");

    let (stop, running) = start_relay_listening_on(
        &url,
        with_params(&url, &[("sslmode", "prefer")]),
        "no-tls-prefer",
    );
    let started = Instant::now();
    loop {
        let plain = diesel::sql_query(
            "SELECT count(*) AS n FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.query LIKE 'LISTEN %' AND NOT s.ssl",
        )
        .get_result::<PlainListen>(&mut conn)
        .expect("pg_stat_ssl")
        .n;
        if plain == 1 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no plain LISTEN connection within 10s; logs:\n{}",
            logs.text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    running.await.expect("no panic");
    let after_prefer = logs.text();
    assert_eq!(
        after_prefer.matches("cannot LISTEN").count(),
        1,
        "prefer listened without a warning:\n{after_prefer}"
    );
    drop(conn);
    drop(server);
}
