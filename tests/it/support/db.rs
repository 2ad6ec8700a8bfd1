//! A fresh database per test, cloned from a migrated template.
//!
//! The template is built once per migration set (its name carries a hash of
//! `migrations/`), under an advisory lock so that parallel test processes do
//! not race to build it, and under a temporary name that is renamed only when
//! complete, so a crash half-way never leaves a broken template behind.

use std::sync::atomic::{AtomicU32, Ordering};

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use order_service::db::{self, PgPool};

pub const DEFAULT_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// The server the tests use: `DATABASE_URL` when set; otherwise the local
/// server on the default port when one answers; otherwise a private server
/// started from the machine's PostgreSQL installation under `target/test-pg`
/// (the demo's launcher), which is left running for the next run.
pub fn admin_url() -> String {
    // Every test connects through here first: the test process, too, must
    // not have OpenSSL torn down under a pool's connect when it exits.
    db::init_openssl();
    static URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var("DATABASE_URL") {
            return without_tls_unless_asked(url);
        }
        let local = without_tls_unless_asked(DEFAULT_ADMIN_URL.to_owned());
        if PgConnection::establish(&local).is_ok() {
            return local;
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-pg");
        let server = outbox_dev_tools::private_pg::PrivatePostgres::start_persistent(&root)
            .unwrap_or_else(|e| {
                panic!("no DATABASE_URL, no local server, and no private one: {e}")
            });
        eprintln!(
            "tests use a private PostgreSQL on port {} ({})",
            server.port(),
            root.display()
        );
        server.url()
    })
    .clone()
}

/// `url` with `sslmode=disable` when neither it nor `PGSSLMODE` names a mode.
///
/// A run opens about 3,400 connections, and on a server with `ssl = on`
/// libpq's default (`prefer`) makes each a TLS handshake, nearly twice the
/// CPU of a plain connection: seconds of a run spent on encryption no test
/// looks at. The tests of TLS itself
/// (`faults/tls.rs`) name their `sslmode`, and the last one named wins.
fn without_tls_unless_asked(url: String) -> String {
    let Ok(mut parsed) = url::Url::parse(&url) else {
        return url;
    };
    let named = parsed.query_pairs().any(|(key, _)| key == "sslmode");
    if named || std::env::var_os("PGSSLMODE").is_some() {
        return url;
    }
    parsed.query_pairs_mut().append_pair("sslmode", "disable");
    parsed.to_string()
}

/// `base` with its database name replaced.
pub fn url_for(base: &str, database: &str) -> String {
    let mut url = url::Url::parse(base).expect("DATABASE_URL is a URL");
    url.set_path(&format!("/{database}"));
    url.to_string()
}

fn admin_conn() -> PgConnection {
    let url = admin_url();
    PgConnection::establish(&url).unwrap_or_else(|e| {
        panic!(
            "cannot connect to {} (set DATABASE_URL): {e}",
            db::redact_url(&url)
        )
    })
}

fn migrations_hash() -> String {
    use sha2::Digest as _;
    // The core's migrations, then the service's, which alter the core's tables.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<_> = walk(&root.join("migrations"));
    files.extend(walk(&root.join("crates/outbox-core/migrations")));
    files.sort();
    let mut hasher = sha2::Sha256::new();
    for file in files {
        hasher.update(file.to_string_lossy().as_bytes());
        hasher.update(std::fs::read(&file).expect("readable migration"));
    }
    hex::encode(&hasher.finalize()[..6])
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("migrations dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[derive(QueryableByName)]
struct Exists {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

fn database_exists(conn: &mut PgConnection, name: &str) -> bool {
    diesel::sql_query("SELECT count(*) AS n FROM pg_database WHERE datname = $1")
        .bind::<Text, _>(name)
        .get_result::<Exists>(conn)
        .expect("query pg_database")
        .n
        > 0
}

fn template_name() -> String {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        let name = format!("outbox_tpl_{}", migrations_hash());
        let mut conn = admin_conn();
        diesel::sql_query("SELECT pg_advisory_lock(727274)")
            .execute(&mut conn)
            .expect("template lock");
        if !database_exists(&mut conn, &name) {
            let building = format!("{name}_building");
            diesel::sql_query(format!("DROP DATABASE IF EXISTS {building} WITH (FORCE)"))
                .execute(&mut conn)
                .expect("drop stale template");
            diesel::sql_query(format!("CREATE DATABASE {building}"))
                .execute(&mut conn)
                .expect("create template");
            {
                let mut tpl = PgConnection::establish(&url_for(&admin_url(), &building))
                    .expect("connect to template");
                db::run_migrations(&mut tpl).expect("migrate template");
            }
            diesel::sql_query(format!("ALTER DATABASE {building} RENAME TO {name}"))
                .execute(&mut conn)
                .expect("publish template");
        }
        diesel::sql_query("SELECT pg_advisory_unlock(727274)")
            .execute(&mut conn)
            .expect("template unlock");
        name
    })
    .clone()
}

/// The tablespace test databases are made in when the server has it.
///
/// Each test database is some 440 files (the catalogs' and the schema's), made
/// from the template and deleted at the test's end, about 300 times a run. On
/// ext4 without a journal, as on this project's machines, every new file's
/// inode is looked for past the inodes deleted in the last minute, so the
/// suite's own churn makes each create and drop cost several times the CPU
/// they cost in a tablespace on tmpfs.
/// `.ci/run` makes it there; see README for a machine of your own.
const TABLESPACE: &str = "outbox_tests";
static TABLESPACE_BROKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn tablespace(conn: &mut PgConnection) -> Option<&'static str> {
    static FOUND: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let found = *FOUND.get_or_init(|| {
        diesel::sql_query("SELECT count(*) AS n FROM pg_tablespace WHERE spcname = $1")
            .bind::<Text, _>(TABLESPACE)
            .get_result::<Exists>(conn)
            .map(|row| row.n > 0)
            .unwrap_or(false)
    });
    (found && !TABLESPACE_BROKEN.load(Ordering::Relaxed)).then_some(TABLESPACE)
}

/// A database of its own for one test, dropped when the value is.
#[derive(Debug)]
pub struct TestDb {
    pub name: String,
    pub url: String,
    /// Dropped after the database (fields drop in order): the seat is free
    /// only once this test's connections are gone.
    _seat: super::seats::Seat,
}

impl TestDb {
    pub fn new() -> TestDb {
        TestDb::create(&template_name())
    }

    /// A database with nothing in it (from PostgreSQL's `template0`): for
    /// what must work without the service's schema, such as the queue core
    /// on its own migrations.
    pub fn empty() -> TestDb {
        TestDb::create("template0")
    }

    fn create(template: &str) -> TestDb {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "outbox_test_{}_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            fastrand::u32(..)
        );
        let mut conn = admin_conn();
        let seat = super::seats::Seat::take(&mut conn);
        // CREATE DATABASE ... TEMPLATE fails if anyone is connected to the
        // template at that instant (another process publishing it): retry.
        let mut tries = 0;
        loop {
            let space = tablespace(&mut conn);
            let create = format!(
                "CREATE DATABASE {name} TEMPLATE {template}{}",
                space
                    .map(|s| format!(" TABLESPACE {s}"))
                    .unwrap_or_default()
            );
            match diesel::sql_query(create).execute(&mut conn) {
                Ok(_) => break,
                Err(e) if space.is_some() && e.to_string().contains("directory") => {
                    // Its directory is gone (a tmpfs after a reboot): the
                    // tests still run, on the server's own disk. Said once,
                    // and past the harness's capture, which would hide it
                    // in a run that passes.
                    if !TABLESPACE_BROKEN.swap(true, Ordering::Relaxed) {
                        use std::io::Write as _;
                        let _ = writeln!(
                            std::io::stderr(),
                            "NOTE: cannot create test databases in tablespace {TABLESPACE} ({e}); \
                             they go to the default tablespace (README: make it again)"
                        );
                    }
                }
                Err(e) if tries < 20 => {
                    tries += 1;
                    eprintln!("create {name} from {template} failed ({e}); retrying");
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                Err(e) => panic!("cannot create test database {name}: {e}"),
            }
        }
        // As on the tests' private server: a commit does not wait for its WAL
        // flush. This server is never crashed under a test (the restart and
        // failover tests run servers of their own), and a test that needs a
        // durable commit sets it in its session. The suite commits hundreds
        // of thousands of times.
        diesel::sql_query(format!(
            "ALTER DATABASE {name} SET synchronous_commit = off"
        ))
        .execute(&mut conn)
        .unwrap_or_else(|e| panic!("cannot set up test database {name}: {e}"));
        let url = url_for(&admin_url(), &name);
        TestDb {
            name,
            url,
            _seat: seat,
        }
    }

    pub fn conn(&self) -> PgConnection {
        PgConnection::establish(&self.url).expect("connect to test database")
    }

    pub fn pool(&self, size: u32) -> PgPool {
        db::build_pool(
            &self.url,
            &db::PoolOptions {
                size,
                ..Default::default()
            },
        )
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if std::env::var_os("KEEP_TEST_DB").is_some() {
            eprintln!("keeping test database {}", self.name);
            return;
        }
        let Ok(mut conn) = PgConnection::establish(&admin_url()) else {
            return;
        };
        // The seat this value frees stands for the test's connections: end
        // them now, whenever the database itself goes.
        let _ = diesel::sql_query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid()",
        )
        .bind::<Text, _>(&self.name)
        .execute(&mut conn);
        let batch = {
            let mut ended = ENDED.lock().unwrap_or_else(|e| e.into_inner());
            ended.push(std::mem::take(&mut self.name));
            if ended.len() >= DROP_TOGETHER {
                std::mem::take(&mut *ended)
            } else {
                Vec::new()
            }
        };
        drop_together(batch);
    }
}

/// Drops every ended test's database now.
pub(super) fn drop_ended() {
    let batch = std::mem::take(&mut *ENDED.lock().unwrap_or_else(|e| e.into_inner()));
    drop_together(batch);
}

/// Databases of ended tests that are not dropped yet.
///
/// Every `DROP DATABASE` makes the server checkpoint before it returns, and a
/// checkpoint writes out every dirty page of every other test's database and
/// the full-page images after it. One drop per test made that about 300
/// checkpoints a run, and most of the suite's system time. Dropped together,
/// from several connections at once, the drops share their checkpoints.
static ENDED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
/// How many ended databases wait for the next drop.
const DROP_TOGETHER: usize = 16;
/// Connections that drop at once (and so share a checkpoint).
const DROPPERS: usize = 4;

fn drop_together(names: Vec<String>) {
    if names.is_empty() {
        return;
    }
    let queue = std::sync::Mutex::new(names);
    std::thread::scope(|scope| {
        for _ in 0..DROPPERS {
            scope.spawn(|| {
                let Ok(mut conn) = PgConnection::establish(&admin_url()) else {
                    return;
                };
                loop {
                    let next = queue.lock().unwrap_or_else(|e| e.into_inner()).pop();
                    let Some(name) = next else { return };
                    let _ =
                        diesel::sql_query(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                            .execute(&mut conn);
                }
            });
        }
    });
}

/// `pg_terminate_backend` on every connection to `database` but `spare` and
/// `conn`'s own, each waited for up to `wait` (zero: signalled, not waited
/// for); how many were ended (or signalled).
pub fn terminate_backends(
    conn: &mut PgConnection,
    database: &str,
    spare: i32,
    wait: std::time::Duration,
) -> i64 {
    #[derive(QueryableByName)]
    struct Killed {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    diesel::sql_query(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, $3)) AS n FROM pg_stat_activity \
         WHERE datname = $1 AND pid <> $2 AND pid <> pg_backend_pid()",
    )
    .bind::<Text, _>(database)
    .bind::<diesel::sql_types::Integer, _>(spare)
    .bind::<BigInt, _>(i64::try_from(wait.as_millis()).unwrap_or(i64::MAX))
    .get_result::<Killed>(conn)
    .expect("terminate backends")
    .n
}
