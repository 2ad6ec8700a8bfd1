//! A database per test, cloned from a template migrated with the core's own
//! migrations only: no table of any application.

use std::hash::{Hash as _, Hasher as _};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use outbox_core::db::{PgPool, PoolOptions, build_pool};
use outbox_core::statements::{ClaimRequest, ClaimedJob, JobLease, claim_jobs};
use outbox_core::worker::Workers;
use outbox_core::worker_pool::{PoolSettings, PoolStats, WorkerPool};
use tokio_util::sync::CancellationToken;

const DEFAULT_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// DATABASE_URL; else the local server on 5432; else a private server from
/// the machine's PostgreSQL programs, the one the service's tests share
/// (`target/test-pg` at the workspace's root), so a newcomer with only those
/// programs can run the tests.
fn admin_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var("DATABASE_URL") {
            return url;
        }
        if PgConnection::establish(DEFAULT_ADMIN_URL).is_ok() {
            return DEFAULT_ADMIN_URL.to_owned();
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-pg");
        let server = outbox_dev_tools::private_pg::PrivatePostgres::start_persistent(&root)
            .unwrap_or_else(|e| {
                panic!("no DATABASE_URL, no local server, and no private one: {e}")
            });
        eprintln!("tests use a private PostgreSQL on port {}", server.port());
        server.url()
    })
    .clone()
}

fn url_for(database: &str) -> String {
    let mut url = url::Url::parse(&admin_url()).expect("DATABASE_URL is a URL");
    url.set_path(&format!("/{database}"));
    url.to_string()
}

fn admin_conn() -> PgConnection {
    PgConnection::establish(&admin_url())
        .unwrap_or_else(|e| panic!("cannot reach PostgreSQL (set DATABASE_URL): {e}"))
}

/// The template's name carries a hash of the migrations, so a changed
/// migration gets a template of its own.
fn template() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .expect("migrations dir")
            .flatten()
            .flat_map(|d| std::fs::read_dir(d.path()).expect("migration").flatten())
            .map(|f| f.path())
            .collect();
        files.sort();
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        for file in files {
            file.hash(&mut hasher);
            std::fs::read(&file)
                .expect("migration file")
                .hash(&mut hasher);
        }
        let name = format!(
            "outbox_core_tpl_{:012x}",
            hasher.finish() & 0xffff_ffff_ffff
        );
        let mut conn = admin_conn();
        // Test binaries of several runs may race to build it.
        diesel::sql_query("SELECT pg_advisory_lock(727275)")
            .execute(&mut conn)
            .expect("template lock");
        #[derive(QueryableByName)]
        struct Count {
            #[diesel(sql_type = BigInt)]
            n: i64,
        }
        let exists = diesel::sql_query("SELECT count(*) AS n FROM pg_database WHERE datname = $1")
            .bind::<Text, _>(&name)
            .get_result::<Count>(&mut conn)
            .expect("pg_database")
            .n
            > 0;
        if !exists {
            // Built under another name and renamed when complete, so a crash
            // half-way never leaves a broken template.
            let building = format!("{name}_building");
            for statement in [
                format!("DROP DATABASE IF EXISTS {building} WITH (FORCE)"),
                format!("CREATE DATABASE {building} TEMPLATE template0"),
            ] {
                diesel::sql_query(statement)
                    .execute(&mut conn)
                    .expect("create template");
            }
            let mut tpl = PgConnection::establish(&url_for(&building)).expect("template");
            outbox_core::db::run_migrations(&mut tpl).expect("the core's migrations");
            drop(tpl);
            diesel::sql_query(format!("ALTER DATABASE {building} RENAME TO {name}"))
                .execute(&mut conn)
                .expect("publish template");
        }
        diesel::sql_query("SELECT pg_advisory_unlock(727275)")
            .execute(&mut conn)
            .expect("template unlock");
        name
    })
}

/// A database of its own for one test, dropped with the value.
#[derive(Debug)]
pub struct TestDb {
    name: String,
    pub url: String,
}

impl TestDb {
    pub fn new() -> TestDb {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "outbox_core_t{}_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            fastrand::u32(..)
        );
        diesel::sql_query(format!("CREATE DATABASE {name} TEMPLATE {}", template()))
            .execute(&mut admin_conn())
            .expect("create test database");
        let url = url_for(&name);
        TestDb { name, url }
    }

    pub fn conn(&self) -> PgConnection {
        PgConnection::establish(&self.url).expect("connect to test database")
    }

    pub fn pool(&self) -> PgPool {
        build_pool(
            &self.url,
            &PoolOptions {
                size: 8,
                ..PoolOptions::default()
            },
        )
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let _ = diesel::sql_query(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ))
        .execute(&mut admin_conn());
    }
}

/// Relay settings for tests: fast polls, short backoff.
/// A tokio-postgres connection to `db`, as the worker pool's own connections
/// are, its connection task spawned.
pub async fn connect(db: &TestDb) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .expect("a tokio-postgres connection");
    tokio::spawn(connection);
    client
}

pub fn settings(worker_id: &str, workers: &Workers) -> PoolSettings {
    let kinds = workers.kinds().iter().map(|k| (*k).to_owned()).collect();
    let mut settings = PoolSettings::new(worker_id, kinds);
    settings.poll_interval = Duration::from_millis(50);
    settings.shutdown_grace = Duration::from_secs(5);
    settings.backoff.base = Duration::from_millis(5);
    settings.backoff.max = Duration::from_millis(20);
    settings
}

/// A relay running in this process until [`Running::stop`].
pub struct Running {
    shutdown: CancellationToken,
    handle: tokio::task::JoinHandle<()>,
    pub stats: Arc<PoolStats>,
}

pub fn spawn_relay(db: &TestDb, settings: PoolSettings, workers: Workers) -> Running {
    let relay = WorkerPool::new(db.pool(), db.url.clone(), settings, Arc::new(workers))
        .expect("valid settings");
    let shutdown = CancellationToken::new();
    let stats = relay.stats();
    let handle = tokio::spawn(relay.run_until_stopped(shutdown.clone()));
    Running {
        shutdown,
        handle,
        stats,
    }
}

impl Running {
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.handle)
            .await
            .expect("the relay stops within 30s")
            .expect("the relay task did not panic");
    }
}

/// Waits until `check` holds, polling; panics naming `what` after `limit`.
pub async fn wait_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Jobs of `status` in `jobs_all` (the live table and the archive).
pub fn count(conn: &mut PgConnection, status: &str) -> i64 {
    use outbox_core::schema::jobs_all;
    jobs_all::table
        .filter(jobs_all::status.eq(status))
        .count()
        .get_result(conn)
        .expect("count jobs")
}

/// The leases of claimed jobs, as the heartbeat and the finish name them.
pub fn leases(jobs: &[ClaimedJob]) -> Vec<JobLease> {
    jobs.iter()
        .map(|j| JobLease {
            job_id: j.id,
            lease_token: j.lease_token,
        })
        .collect()
}

/// One job of `kind`, claimed by `worker_id` for `lease`.
pub fn claim_one(
    conn: &mut PgConnection,
    kind: &str,
    worker_id: &str,
    lease: Duration,
) -> ClaimedJob {
    claim_jobs(
        conn,
        &ClaimRequest {
            worker_id,
            kinds: &[kind.to_owned()],
            limit: 1,
            lease,
        },
    )
    .expect("claim")
    .pop()
    .expect("a claimable job")
}

/// True once a session of this database other than `conn`'s waits on LISTEN.
pub fn listening(conn: &mut PgConnection) -> bool {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    diesel::sql_query(
        "SELECT count(*) AS n FROM pg_stat_activity
         WHERE datname = current_database() AND query LIKE 'LISTEN%' AND pid <> pg_backend_pid()",
    )
    .get_result::<Count>(conn)
    .expect("pg_stat_activity")
    .n > 0
}
