//! Shared test support: isolated databases, factories, a relay harness.

pub mod app;
pub mod browser;
pub mod db;
pub mod http;
pub mod process;
pub mod proxy;
pub mod seats;
pub mod smtp;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use order_service::effects::{BoxFuture, EffectResult, JobContext, JobHandler};
use order_service::orders::NewOrder;
use order_service::outbox::{Enqueuer, NewJob};
use order_service::outbox_core::statements::ClaimedJob;
use order_service::worker_pool::{PoolSettings, PoolStats, WorkerPool};
use tokio_util::sync::CancellationToken;

pub use self::db::TestDb;

/// Enqueues one untyped job with the queue's own enqueuer (NOTIFY in the
/// transaction), as an application without columns of its own would.
pub fn enqueue(conn: &mut PgConnection, job: &NewJob) -> QueryResult<i64> {
    Ok(enqueue_many(conn, std::slice::from_ref(job))?[0])
}

/// [`enqueue`] for several jobs, in one INSERT.
pub fn enqueue_many(conn: &mut PgConnection, jobs: &[NewJob]) -> QueryResult<Vec<i64>> {
    Enqueuer::new().enqueue_many(conn, jobs)
}

/// `TEST_LOG=1` shows the traces of the code under test.
/// Whether every optional tool is required: `CI=true`, which `.ci/run`
/// exports.
pub fn tools_required() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// An optional tool a test uses is missing (`what`, and how to install it):
/// under `CI=true` a failure naming it, else one line on stderr, straight
/// past the harness's capture (which would hide it for a passing test), and
/// the test goes on without that check.
#[track_caller]
pub fn optional_tool_missing(what: &str, install: &str) {
    assert!(
        !tools_required(),
        "{what} is missing, and with CI=true every optional tool is required ({install})"
    );
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {what} is missing, so its check did not run ({install})"
    );
}

pub fn init_tracing() {
    if std::env::var_os("TEST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "debug,hyper=info,h2=info".into()),
            )
            .with_test_writer()
            .try_init();
    }
}

/// The subset of Noto Sans CJK that ships with the tests (`tests/fonts/`):
/// receipts in Chinese, Japanese and Korean without a font on the machine.
pub fn test_cjk_font() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fonts/NotoSansCJK-Regular-subset.otf")
}

pub fn order_json(name: &str) -> serde_json::Value {
    serde_json::json!({
        "customer_email": "ada@example.com",
        "customer_name": name,
        "currency": "EUR",
        "items": [
            {"sku": "TEA-1", "name": "Green tea", "quantity": 2, "unit_price_cents": 450},
            {"sku": "MUG-2", "name": "Mug", "quantity": 1, "unit_price_cents": 1200}
        ]
    })
}

/// Moves the order by `action` with `body` (a valid transition) and returns
/// the event it recorded (or had recorded, for a repeat).
pub fn transition(
    conn: &mut PgConnection,
    order_id: i64,
    action: &str,
    body: serde_json::Value,
) -> i64 {
    use order_service::orders::{Transition, TransitionOutcome, order_enqueuer, transition_order};
    let transition = Transition::parse(action, &body).expect("a valid transition");
    match transition_order(conn, &order_enqueuer(), order_id, &transition, None, 8).expect(action) {
        TransitionOutcome::Applied { event_id } | TransitionOutcome::Repeated { event_id } => {
            event_id
        }
    }
}

pub fn sample_order() -> NewOrder {
    NewOrder::parse(&order_json("Ada Lovelace")).expect("sample order is valid")
}

/// Jobs by status, wherever they live (`jobs_all`: `jobs` and the archive).
pub fn status_counts(conn: &mut PgConnection) -> HashMap<String, i64> {
    use order_service::schema::jobs_all;
    jobs_all::table
        .group_by(jobs_all::status)
        .select((jobs_all::status, diesel::dsl::count_star()))
        .load::<(String, i64)>(conn)
        .expect("count jobs")
        .into_iter()
        .collect()
}

/// Makes the jobs matching `condition` (SQL over `jobs`) done as the relay's
/// finish does: they leave `jobs` and are appended to `jobs_done` in one
/// statement, with `finished_at` set to the SQL expression `finished_at`
/// (`now()`, `now() - interval '10 days'`) and at least one attempt. Returns
/// how many moved. A row whose day has no partition lands in
/// `jobs_done_default`, as the relay's would.
pub fn make_done(conn: &mut PgConnection, condition: &str, finished_at: &str) -> usize {
    diesel::sql_query(format!(
        "WITH moved AS ( \
             DELETE FROM jobs WHERE {condition} \
             RETURNING id, order_id, kind, payload, run_after, attempts, max_attempts, \
                       locked_by, locked_at, lease_expires_at, created_at, last_error, \
                       lease_token, trace_context, ordering_key) \
         INSERT INTO jobs_done (id, order_id, kind, payload, status, run_after, attempts, \
                                max_attempts, locked_by, locked_at, lease_expires_at, \
                                created_at, finished_at, last_error, lease_token, \
                                trace_context, ordering_key, blocked) \
         SELECT id, order_id, kind, payload, 'done', run_after, greatest(attempts, 1), \
                max_attempts, locked_by, locked_at, lease_expires_at, created_at, \
                {finished_at}, last_error, lease_token, trace_context, ordering_key, false \
         FROM moved"
    ))
    .execute(conn)
    .expect("move jobs to jobs_done")
}

pub fn count(conn: &mut PgConnection, status: &str) -> i64 {
    status_counts(conn).get(status).copied().unwrap_or(0)
}

/// Polls `check` until it returns true; panics with `what` after `timeout`.
pub async fn wait_until(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An executor made of a closure: tests script what each job does.
pub struct FnExecutor<F>(pub F);

impl<F, Fut> JobHandler for FnExecutor<F>
where
    F: Fn(ClaimedJob) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = EffectResult> + Send + 'static,
{
    fn execute<'a>(&'a self, job: &'a ClaimedJob, _ctx: JobContext) -> BoxFuture<'a, EffectResult> {
        Box::pin((self.0)(job.clone()))
    }
}

pub fn executor<F, Fut>(f: F) -> Arc<dyn JobHandler>
where
    F: Fn(ClaimedJob) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = EffectResult> + Send + 'static,
{
    Arc::new(FnExecutor(f))
}

/// Relay settings for tests: fast polls and short leases.
pub fn test_settings(worker: &str, kinds: &[&str]) -> PoolSettings {
    let mut settings = PoolSettings::new(worker, kinds.iter().map(|k| (*k).to_owned()).collect())
        .with_lease(Duration::from_secs(30));
    settings.poll_interval = Duration::from_millis(100);
    settings.shutdown_grace = Duration::from_secs(10);
    settings.backoff.base = Duration::from_millis(10);
    settings.backoff.max = Duration::from_millis(100);
    settings
}

/// A relay running in this process.
pub struct RunningRelay {
    pub shutdown: CancellationToken,
    pub stats: Arc<PoolStats>,
    handle: tokio::task::JoinHandle<()>,
}

impl RunningRelay {
    /// Asks for shutdown and waits for the relay to return.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(60), self.handle)
            .await
            .expect("relay stops within 60s")
            .expect("relay task did not panic");
    }
}

pub fn spawn_relay(
    db: &TestDb,
    settings: PoolSettings,
    executor: Arc<dyn JobHandler>,
) -> RunningRelay {
    let pool = db.pool(u32::try_from(settings.concurrency).unwrap_or(16) + 4);
    let relay =
        WorkerPool::new(pool, db.url.clone(), settings, executor).expect("valid relay settings");
    let stats = relay.stats();
    let shutdown = CancellationToken::new();
    let handle = tokio::spawn(relay.run_until_stopped(shutdown.clone()));
    RunningRelay {
        shutdown,
        stats,
        handle,
    }
}

/// The value of one Prometheus series (summed over series whose labels include
/// all of `labels`); 0 when absent.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            (metric == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
            .then(|| value.parse::<f64>().ok())
            .flatten()
        })
        .sum()
}

/// Buffers one claim of 16 `noop` jobs reads (hits + reads of the top plan
/// node), measured with EXPLAIN ANALYZE in a transaction rolled back
/// afterwards, so nothing is claimed. Starts at `after`, or at the front.
pub fn claim_buffers(
    conn: &mut diesel::PgConnection,
    after: Option<order_service::outbox_core::statements::ClaimPosition>,
) -> i64 {
    use diesel::RunQueryDsl as _;
    use diesel::connection::SimpleConnection as _;
    use diesel::sql_types::{Array, BigInt, Nullable, Text, Timestamptz};
    #[derive(diesel::QueryableByName)]
    struct Plan {
        #[diesel(sql_type = Text, column_name = "QUERY PLAN")]
        plan: String,
    }
    let sql = format!(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}",
        include_str!("../../../crates/outbox-core/src/outbox/sql/claim_jobs.sql")
    );
    conn.batch_execute("BEGIN").expect("begin");
    let plan: Plan = diesel::sql_query(&sql)
        .bind::<BigInt, _>(16_i64)
        .bind::<Array<Text>, _>(vec!["noop"])
        .bind::<Text, _>("w")
        .bind::<BigInt, _>(60_000_i64)
        .bind::<Nullable<Timestamptz>, _>(after.map(|a| a.run_after))
        .bind::<BigInt, _>(after.map_or(0, |a| a.id))
        .get_result(conn)
        .expect("explain");
    conn.batch_execute("ROLLBACK").expect("rollback");
    let json: serde_json::Value = serde_json::from_str(&plan.plan).expect("plan JSON");
    let top = &json[0]["Plan"];
    top["Shared Hit Blocks"].as_i64().unwrap_or(0) + top["Shared Read Blocks"].as_i64().unwrap_or(0)
}
