//! A primary failover under a running relay and API: a primary and its
//! streaming standby on this machine ([`cluster`]), both processes given a
//! two-host `DATABASE_URL` with `target_session_attrs=read-write`, orders
//! placed and drained throughout; then the primary stops at once
//! (`pg_ctl stop -m immediate`) and the standby is promoted. Neither process is
//! restarted. The time from the promotion to the relay's first finished job is
//! printed (`time to first progress`).

mod cluster;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::BigInt;
use reqwest::StatusCode;
use tokio_util::sync::CancellationToken;

use self::cluster::{Cluster, Replication};
use super::{Sinks, wait_all_terminal};
use crate::support::app::{create_api_key, http_client, http_client_with_key};
use crate::support::http::Answer;
use crate::support::order_json;
use crate::support::process::{BinProcess, Launch};
use order_service::api_keys::Scope;

const MINUTE: Duration = Duration::from_secs(60);

/// One `POST /orders` as the load saw it.
#[derive(Debug, Clone)]
struct Placed {
    at: Instant,
    status: StatusCode,
    order_id: Option<i64>,
}

/// Clients placing orders through the API until stopped, each answer kept.
struct Load {
    answers: Arc<Mutex<Vec<Placed>>>,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(base: &str, api_key: &str, clients: usize) -> Load {
        let answers = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let tasks = (0..clients)
            .map(|_| {
                let (answers, stop, base) = (answers.clone(), stop.clone(), base.to_owned());
                let client = http_client_with_key(api_key);
                tokio::spawn(async move {
                    while !stop.is_cancelled() {
                        let placed = place(&client, &base).await;
                        answers.lock().expect("answers").push(placed);
                        tokio::time::sleep(Duration::from_millis(30)).await;
                    }
                })
            })
            .collect();
        Load {
            answers,
            stop,
            tasks,
        }
    }

    fn answers(&self) -> Vec<Placed> {
        self.answers.lock().expect("answers").clone()
    }

    async fn wait_created(&self, n: usize, since: Instant) {
        let deadline = Instant::now() + MINUTE;
        while self
            .answers()
            .iter()
            .filter(|a| a.at >= since && a.status == StatusCode::CREATED)
            .count()
            < n
        {
            assert!(
                Instant::now() < deadline,
                "the API placed no orders: {:?}",
                self.answers().last()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(self) -> Vec<Placed> {
        self.stop.cancel();
        for task in self.tasks {
            task.await.expect("load task");
        }
        self.answers.lock().expect("answers").clone()
    }
}

async fn place(client: &reqwest::Client, base: &str) -> Placed {
    let response = tokio::time::timeout(
        Duration::from_secs(20),
        client
            .post(format!("{base}/orders"))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&order_json("Ada")).expect("JSON"))
            .send(),
    )
    .await
    .expect("the API answers within 20s, it does not hang")
    .expect("POST /orders");
    let order_id = response
        .headers()
        .get("location")
        .and_then(|l| l.to_str().ok())
        .and_then(|l| l.rsplit('/').next())
        .and_then(|id| id.parse().ok());
    let status = response.status();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        assert!(
            response.headers().contains_key("retry-after"),
            "a 503 says when to retry"
        );
        let body: serde_json::Value = response.json().await.expect("a JSON 503");
        assert_eq!(body["error"]["code"], "database_unavailable", "{body}");
    }
    Placed {
        at: Instant::now(),
        status,
        order_id,
    }
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Finished jobs on the server at `url`; `None` while it cannot be asked.
fn done_jobs(url: &str) -> Option<i64> {
    let mut conn = PgConnection::establish(url).ok()?;
    diesel::sql_query("SELECT count(*) AS n FROM jobs_done")
        .get_result::<Count>(&mut conn)
        .ok()
        .map(|c| c.n)
}

/// Crashes the primary with orders being placed and drained, keeps it down
/// for `outage`, promotes the standby, and returns the time from the
/// promotion to the first job the relay finishes on the new primary.
async fn switch(cluster: Cluster, outage: Duration) -> (Cluster, Instant, Duration) {
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.crash_primary();
        cluster
    })
    .await
    .expect("task");
    tokio::time::sleep(outage).await;
    let (cluster, promoted) = tokio::task::spawn_blocking(move || {
        let mut cluster = cluster;
        cluster.promote_standby();
        (cluster, Instant::now())
    })
    .await
    .expect("task");
    let url = cluster.primary_url();
    let before = {
        let url = url.clone();
        tokio::task::spawn_blocking(move || done_jobs(&url))
            .await
            .expect("task")
            .expect("the promoted standby answers")
    };
    loop {
        let url = url.clone();
        let now = tokio::task::spawn_blocking(move || done_jobs(&url))
            .await
            .expect("task");
        if now.is_some_and(|n| n > before) {
            break;
        }
        assert!(
            promoted.elapsed() < MINUTE,
            "the relay finished nothing on the new primary"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let progress = promoted.elapsed();
    (cluster, promoted, progress)
}

/// The relay, mailing to and calling `sinks`, with the webhook receiver slow
/// enough that deliveries are in flight at the crash; and an API key to place
/// orders with.
async fn start_processes(sinks: &Sinks, url: &str) -> (BinProcess, String, BinProcess, String) {
    let (api, base) = BinProcess::start_api(Launch::serve("failover-api", url)).await;
    let (relay, _) = BinProcess::start_relay(sinks.relay("failover-relay", url)).await;
    let api_key = create_api_key(url, "failover", &[Scope::Place]);
    (api, base, relay, api_key)
}

/// Every order whose POST answered 201 is on `conn`'s server.
fn missing_orders(conn: &mut PgConnection, answers: &[Placed]) -> Vec<i64> {
    let created: Vec<i64> = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED)
        .filter_map(|a| a.order_id)
        .collect();
    let present: Vec<i64> = order_service::schema::orders::table
        .select(order_service::schema::orders::id)
        .filter(order_service::schema::orders::id.eq_any(&created))
        .load(conn)
        .expect("orders");
    created
        .into_iter()
        .filter(|id| !present.contains(id))
        .collect()
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort_unstable();
    values[values.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_synchronous_standby_takes_over_under_load_with_nothing_lost_or_stuck() {
    let cluster = tokio::task::spawn_blocking(|| Cluster::start(Replication::Sync))
        .await
        .expect("task");
    let url = cluster.url();
    let sinks = Sinks::start([], Answer::Hang(Duration::from_millis(200))).await;
    let (mut api, base, mut relay, api_key) = start_processes(&sinks, &url).await;
    let load = Load::start(&base, &api_key, 3);
    let started = Instant::now();
    load.wait_created(20, started).await;
    crate::support::wait_until("a webhook in flight", MINUTE, || {
        !sinks.http.requests().is_empty()
    })
    .await;

    // Longer than the API's 2s wait for a connection: requests meet no primary.
    let crashed = Instant::now();
    let (cluster, promoted, progress) = switch(cluster, Duration::from_secs(3)).await;
    load.wait_created(10, promoted).await;
    let answers = load.stop().await;

    let mut conn = PgConnection::establish(&cluster.primary_url()).expect("the new primary");
    wait_all_terminal(&mut conn, MINUTE).await;
    assert!(
        api.is_running() && relay.is_running(),
        "no process restarted"
    );
    api.terminate().await;
    relay.terminate().await;

    for answer in &answers {
        assert!(
            answer.status == StatusCode::CREATED
                || answer.status == StatusCode::SERVICE_UNAVAILABLE,
            "only 201 or 503 (never 500): {answer:?}"
        );
    }
    let during = |a: &&Placed| a.at >= crashed && a.at < promoted;
    assert!(
        answers
            .iter()
            .filter(during)
            .any(|a| a.status == StatusCode::SERVICE_UNAVAILABLE),
        "503 while there was no primary: {answers:?}"
    );
    let last = answers.last().expect("answers");
    assert_eq!(
        last.status,
        StatusCode::CREATED,
        "201 again after the promotion"
    );
    assert_eq!(
        missing_orders(&mut conn, &answers),
        Vec::<i64>::new(),
        "acknowledged orders lost"
    );
    let summary = sinks.check(&mut conn);
    assert_eq!(summary.failed, 0, "{summary:?}");
    assert!(
        progress < Duration::from_secs(10),
        "the relay took {progress:?} after the promotion to finish a job"
    );
    let created = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED)
        .count();
    let unavailable = answers.len() - created;
    eprintln!(
        "failover (sync): time to first progress after promotion {progress:?}; {created} orders placed, {unavailable} answered 503; {summary:?}"
    );
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_the_primary_back_and_forth_three_times_loses_nothing() {
    let cluster = tokio::task::spawn_blocking(|| Cluster::start(Replication::Sync))
        .await
        .expect("task");
    let url = cluster.url();
    let sinks = Sinks::start([], Answer::Hang(Duration::from_millis(100))).await;
    let (mut api, base, mut relay, api_key) = start_processes(&sinks, &url).await;
    let load = Load::start(&base, &api_key, 2);
    load.wait_created(10, Instant::now()).await;

    let mut cluster = cluster;
    let mut times = Vec::new();
    for _ in 0..3 {
        let (switched, promoted, progress) = switch(cluster, Duration::from_millis(500)).await;
        times.push(progress);
        load.wait_created(5, promoted).await;
        // The old primary comes back as a standby of the new one (a fresh
        // base backup), ready to take over in turn.
        cluster = tokio::task::spawn_blocking(move || {
            switched.rebuild_standby(switched.old_primary());
            switched
        })
        .await
        .expect("task");
    }
    let since = Instant::now();
    load.wait_created(5, since).await;
    let answers = load.stop().await;

    let mut conn = PgConnection::establish(&cluster.primary_url()).expect("the primary");
    wait_all_terminal(&mut conn, MINUTE).await;
    assert!(
        api.is_running() && relay.is_running(),
        "no process restarted"
    );
    api.terminate().await;
    relay.terminate().await;
    assert!(
        answers
            .iter()
            .all(|a| a.status == StatusCode::CREATED || a.status == StatusCode::SERVICE_UNAVAILABLE),
        "only 201 or 503: {answers:?}"
    );
    assert_eq!(
        missing_orders(&mut conn, &answers),
        Vec::<i64>::new(),
        "acknowledged orders lost"
    );
    let summary = sinks.check(&mut conn);
    assert_eq!(summary.failed, 0, "{summary:?}");
    for progress in &times {
        assert!(*progress < Duration::from_secs(10), "{times:?}");
    }
    eprintln!(
        "switch-back: time to first progress after each of 3 promotions {times:?}, median {:?}; {summary:?}",
        median(times.clone())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_asynchronous_replication_only_what_the_database_lost_is_lost() {
    let cluster = tokio::task::spawn_blocking(|| Cluster::start(Replication::Async))
        .await
        .expect("task");
    let url = cluster.url();
    let sinks = Sinks::start([], Answer::Hang(Duration::from_millis(200))).await;
    let (mut api, base, mut relay, api_key) = start_processes(&sinks, &url).await;
    let load = Load::start(&base, &api_key, 3);
    load.wait_created(20, Instant::now()).await;
    let (cluster, promoted, progress) = switch(cluster, Duration::from_secs(1)).await;
    load.wait_created(10, promoted).await;
    let answers = load.stop().await;

    let mut conn = PgConnection::establish(&cluster.primary_url()).expect("the new primary");
    wait_all_terminal(&mut conn, MINUTE).await;
    assert!(
        api.is_running() && relay.is_running(),
        "no process restarted"
    );
    api.terminate().await;
    relay.terminate().await;
    assert!(
        answers
            .iter()
            .all(|a| a.status == StatusCode::CREATED || a.status == StatusCode::SERVICE_UNAVAILABLE),
        "only 201 or 503: {answers:?}"
    );
    // What the standby had not received is gone with its jobs; effects already
    // performed for it stay performed, and are left out of the invariants.
    let lost = missing_orders(&mut conn, &answers);
    let kept = |order_id: Option<i64>| order_id.is_some_and(|id| !lost.contains(&id));
    let webhooks: Vec<_> = sinks
        .http
        .requests()
        .into_iter()
        .filter(|r| kept(r.json()["order"]["id"].as_i64()))
        .collect();
    let mails: Vec<_> = sinks
        .smtp
        .mails()
        .into_iter()
        .filter(|m| {
            kept(
                m.header("subject")
                    .unwrap_or_default()
                    .strip_prefix("Your order #")
                    .and_then(|rest| rest.split(' ').next())
                    .and_then(|n| n.parse().ok()),
            )
        })
        .collect();
    let summary = super::assert_invariants(&mut conn, &webhooks, &mails);
    assert_eq!(summary.failed, 0, "{summary:?}");
    assert!(progress < Duration::from_secs(10), "{progress:?}");
    eprintln!(
        "failover (async): time to first progress {progress:?}; acknowledged orders the new primary never received: {}; {summary:?}",
        lost.len()
    );
}

#[derive(QueryableByName)]
struct Setting {
    #[diesel(sql_type = diesel::sql_types::Text)]
    value: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_on_a_read_only_server_is_discarded_not_reused() {
    use order_service::db::{DbError, Failure, run_blocking};
    let db = crate::support::TestDb::new();
    let pool = db.pool(1);
    // What a connection to a demoted primary sees: every write refused (25006).
    run_blocking(&pool, |conn| {
        diesel::sql_query("SET default_transaction_read_only = on").execute(conn)?;
        Ok(())
    })
    .await
    .expect("SET");

    let error: DbError = run_blocking(&pool, |conn| {
        diesel::sql_query("CREATE TABLE written (id int)").execute(conn)?;
        Ok(())
    })
    .await
    .expect_err("a read-only session refuses the write");
    assert_eq!(error.failure(), Failure::Unavailable, "{error}");
    assert!(error.is_unavailable(), "the API answers 503: {error}");

    // The one pooled connection was closed: the next is a new, writable one.
    let read_only = run_blocking(&pool, |conn| {
        Ok(
            diesel::sql_query("SELECT current_setting('default_transaction_read_only') AS value")
                .get_result::<Setting>(conn)?
                .value,
        )
    })
    .await
    .expect("a fresh connection");
    assert_eq!(read_only, "off");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_whose_hosts_are_all_standbys_waits_says_so_once_and_starts_when_one_is_promoted() {
    let cluster = tokio::task::spawn_blocking(|| Cluster::start(Replication::Async))
        .await
        .expect("task");
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.crash_primary();
        cluster
    })
    .await
    .expect("task");
    let sinks = Sinks::start([], Answer::status(200)).await;
    let mut relay = sinks.relay("standby-relay", &cluster.url()).spawn();
    let line = relay.wait_for_line("serving /metrics", MINUTE).await;
    let addr = crate::support::process::field(&line, "addr")
        .expect("addr")
        .to_owned();
    relay.wait_for_line("waiting for a primary", MINUTE).await;
    let client = http_client();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ready = client
        .get(format!("http://{addr}/readyz"))
        .send()
        .await
        .expect("GET /readyz");
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    let again = client
        .get(format!("http://{addr}/readyz"))
        .send()
        .await
        .expect("GET /readyz");
    assert_eq!(again.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(relay.is_running(), "it waits, it does not exit");
    let log = relay.stderr();
    for said_once in ["waiting for a primary", "health check failed"] {
        assert_eq!(
            log.lines()
                .filter(|l| l.contains("WARN") && l.contains(said_once))
                .count(),
            1,
            "{said_once:?} at WARN once per outage: {log}"
        );
    }

    let cluster = tokio::task::spawn_blocking(move || {
        let mut cluster = cluster;
        cluster.promote_standby();
        cluster
    })
    .await
    .expect("task");
    relay.wait_for_line("relay started", MINUTE).await;
    let ready = client
        .get(format!("http://{addr}/readyz"))
        .send()
        .await
        .expect("GET /readyz");
    assert_eq!(ready.status(), StatusCode::OK);
    relay.terminate().await;
    drop(cluster);
}
