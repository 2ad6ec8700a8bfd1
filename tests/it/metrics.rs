//! Prometheus metrics: scraped over HTTP, seen moving when requests and jobs happen.

use crate::support::enqueue;
use order_service::orders::order_enqueuer;
use std::time::Duration;

use order_service::outbox::{NewJob, QueueDepth, queue_depth};
use reqwest::StatusCode;

use crate::support::app::{http_client, spawn_app};
use crate::support::{
    TestDb, count, executor, order_json, sample_order, spawn_relay, test_settings, wait_until,
};

/// The `outbox_jobs` gauge is process-wide and each test's app re-counts it
/// from its own database on scrape, so tests that read it take turns.
static GAUGE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn scrape(client: &reqwest::Client, url: &str) -> String {
    let response = client.get(url).send().await.expect("GET /metrics");
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers()["content-type"]
        .to_str()
        .expect("ASCII")
        .to_owned();
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    response.text().await.expect("metrics text")
}

/// Scrapes until `ready` holds of the text or 10 seconds pass; the last text.
async fn scrape_until(client: &reqwest::Client, url: &str, ready: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = scrape(client, url).await;
        if ready(&text) || std::time::Instant::now() >= deadline {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_http_requests_and_job_counters_moving_after_a_job_runs() {
    let _gauge = GAUGE.lock().await;
    let app = spawn_app().await;
    let metrics_url = app.metrics_url("/metrics");
    // A kind no other test uses, so the job counters below are this test's alone.
    const KIND: &str = "metrics_probe";
    let before = scrape(&app.client, &metrics_url).await;
    let created = [("method", "POST"), ("route", "/orders"), ("status", "201")];

    let response = app.post_order(&order_json("Ada"), None).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let mut conn = app.db.conn();
    enqueue(&mut conn, &NewJob::new(KIND, serde_json::json!({}))).expect("enqueue");
    let relay = spawn_relay(
        &app.db,
        test_settings("metrics", &[KIND]),
        executor(|_| async { Ok(None) }),
    );
    wait_until("the probe job done", Duration::from_secs(20), || {
        count(&mut conn, "done") == 1
    })
    .await;
    relay.stop().await;
    // The done count comes from the archive's statistics, which trail the
    // relay's commit by about a second (see queue_depth.sql).
    let after = scrape_until(&app.client, &metrics_url, |text| {
        crate::support::metric(text, "outbox_jobs", &[("status", "done")]) == 1.0
    })
    .await;

    let kind = [("kind", KIND)];
    assert_eq!(
        crate::support::metric(&before, "outbox_jobs_claimed_total", &kind),
        0.0
    );
    assert_eq!(
        crate::support::metric(&after, "outbox_jobs_claimed_total", &kind),
        1.0
    );
    assert_eq!(
        crate::support::metric(
            &after,
            "outbox_jobs_finished_total",
            &[("kind", KIND), ("outcome", "done")]
        ),
        1.0
    );
    assert_eq!(
        crate::support::metric(&after, "outbox_effect_duration_seconds_count", &kind),
        1.0
    );
    assert!(crate::support::metric(&after, "outbox_claim_batch_size_count", &[]) >= 1.0);
    assert!(
        crate::support::metric(&after, "http_requests_total", &created)
            >= crate::support::metric(&before, "http_requests_total", &created) + 1.0,
        "{after}"
    );
    assert!(crate::support::metric(&after, "http_request_duration_seconds_count", &created) >= 1.0);
    assert!(
        after.contains("http_request_duration_seconds_bucket{"),
        "a histogram: {after}"
    );
    assert!(
        after.contains("# HELP outbox_jobs_finished_total"),
        "described: {after}"
    );

    // The order's three jobs wait; the probe is done.
    assert_eq!(
        crate::support::metric(&after, "outbox_jobs", &[("status", "pending")]),
        3.0
    );
    assert_eq!(
        crate::support::metric(&after, "outbox_jobs", &[("status", "done")]),
        1.0
    );
    assert_eq!(
        crate::support::metric(&after, "outbox_jobs", &[("status", "failed")]),
        0.0
    );
    assert_eq!(
        crate::support::metric(&after, "outbox_jobs", &[("status", "processing")]),
        0.0
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relays_metrics_endpoint_serves_queue_depth_and_health() {
    let _gauge = GAUGE.lock().await;
    let db = TestDb::new();
    let mut conn = db.conn();
    order_service::orders::place_order(&mut conn, &order_enqueuer(), &sample_order(), None, 8)
        .expect("place");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(order_service::telemetry::serve_metrics(
        listener,
        db.pool(2),
        order_service::http_server::ConnectionLimits::default(),
        std::sync::Arc::default(),
        None,
        order_service::telemetry::QUEUE_DEPTH_TTL,
        shutdown.clone(),
    ));
    let client = http_client();

    let text = scrape(&client, &format!("http://{addr}/metrics")).await;
    let health = client
        .get(format!("http://{addr}/healthz"))
        .send()
        .await
        .expect("GET /healthz");

    assert_eq!(
        crate::support::metric(&text, "outbox_jobs", &[("status", "pending")]),
        3.0
    );
    assert_eq!(health.status(), StatusCode::OK);
    shutdown.cancel();
    server.await.expect("task").expect("serve_metrics");
}

/// `queue_depth` until `done` reaches `expected` or `timeout` passes: the
/// archive's count is PostgreSQL's live-row counter, which a backend flushes
/// to the shared statistics when idle, at most once a second unless asked.
fn queue_depth_once_done_is(
    conn: &mut diesel::PgConnection,
    expected: i64,
    timeout: Duration,
) -> QueueDepth {
    use diesel::RunQueryDsl as _;
    let deadline = std::time::Instant::now() + timeout;
    loop {
        diesel::sql_query("SELECT pg_stat_force_next_flush()")
            .execute(conn)
            .expect("flush statistics");
        let depth = queue_depth(conn).expect("queue depth");
        if depth.done == expected || std::time::Instant::now() >= deadline {
            return depth;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn queue_depth_counts_jobs_by_status() {
    let db = TestDb::new();
    let mut conn = db.conn();
    assert_eq!(queue_depth(&mut conn), Ok(QueueDepth::default()));
    for _ in 0..2 {
        order_service::orders::place_order(&mut conn, &order_enqueuer(), &sample_order(), None, 8)
            .expect("place");
    }
    use diesel::RunQueryDsl as _;
    crate::support::make_done(&mut conn, "kind = 'receipt_pdf'", "now()");
    diesel::sql_query(
        "UPDATE jobs SET status = 'failed', finished_at = now() \
         WHERE id = (SELECT min(id) FROM jobs WHERE kind = 'order_webhook')",
    )
    .execute(&mut conn)
    .expect("failed");
    diesel::sql_query(
        "UPDATE jobs SET status = 'processing', locked_by = 'w', attempts = 1, \
         lease_token = nextval('jobs_lease_token_seq'), \
         lease_expires_at = now() + interval '1 minute' \
         WHERE id = (SELECT min(id) FROM jobs WHERE kind = 'confirmation_email')",
    )
    .execute(&mut conn)
    .expect("processing");

    assert_eq!(
        queue_depth_once_done_is(&mut conn, 2, Duration::from_secs(10)),
        QueueDepth {
            pending: 2,
            processing: 1,
            done: 2,
            failed: 1,
            cancelled: 0
        }
    );
}

#[test]
fn queue_depth_counts_done_jobs_from_the_archives_statistics_not_its_rows() {
    use diesel::RunQueryDsl as _;
    let db = TestDb::new();
    let mut conn = db.conn();
    diesel::sql_query("SELECT jobs_done_ensure_partitions(now() - interval '3 days', 2)")
        .execute(&mut conn)
        .expect("partitions");
    for _ in 0..3 {
        order_service::orders::place_order(&mut conn, &order_enqueuer(), &sample_order(), None, 8)
            .expect("place");
    }
    // Done on three different days and in the default partition (40 days ago
    // has none): every partition's counter is summed.
    crate::support::make_done(&mut conn, "kind = 'receipt_pdf'", "now()");
    crate::support::make_done(
        &mut conn,
        "kind = 'order_webhook'",
        "now() - interval '2 days'",
    );
    crate::support::make_done(
        &mut conn,
        "id = (SELECT min(id) FROM jobs WHERE kind = 'confirmation_email')",
        "now() - interval '40 days'",
    );
    // A job the relay finished before it moved done jobs to the archive.
    diesel::sql_query(
        "UPDATE jobs SET status = 'done', attempts = 1, finished_at = now() \
         WHERE id = (SELECT max(id) FROM jobs WHERE kind = 'confirmation_email')",
    )
    .execute(&mut conn)
    .expect("a done job left in jobs");

    let depth = queue_depth_once_done_is(&mut conn, 3 + 3 + 1 + 1, Duration::from_secs(10));

    assert_eq!(
        depth,
        QueueDepth {
            pending: 1,
            processing: 0,
            done: 8,
            failed: 0,
            cancelled: 0
        },
        "the archive's 7 from its statistics, and the one still in jobs"
    );

    // A prune drops the old rows; the counter follows.
    order_service::outbox::prune_done_jobs(&mut conn, Duration::from_secs(86_400), 100, |_| {})
        .expect("prune");
    let depth = queue_depth_once_done_is(&mut conn, 4, Duration::from_secs(10));
    assert_eq!(depth.done, 4, "3 of today and the one in jobs: {depth:?}");
}
