//! Connection pool, the queue's embedded migrations, and running Diesel off
//! the async threads.
//!
//! Diesel is synchronous. Every query made from async code goes through
//! [`run_blocking`], which checks a connection out of the r2d2 pool inside
//! `spawn_blocking`, so a slow query never stalls a tokio worker thread.

use std::time::Duration;

use diesel::pg::PgConnection;
use diesel::r2d2::{ConnectionManager, Pool};
use diesel::sql_types::BigInt;
use diesel::{RunQueryDsl, sql_query};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

mod checkout;
mod failure;
mod own;
mod prepared;

pub use checkout::{run_blocking_pinged, run_blocking_retried};
pub use failure::{DbError, Failure};
use failure::{discard, must_discard};
pub(crate) use own::query_expecting;
pub use own::{OwnConnection, OwnConnections, REOPEN_AFTER};
pub use prepared::{PrepareOnce, Prepared, prepare_insert};

/// An r2d2 pool of Diesel PostgreSQL connections, as [`build_pool`] builds
/// it. Cheap to clone (clones share the pool), and
/// safe to share between threads and tasks. Its connections are blocking:
/// use them from async code only through [`run_blocking`].
pub type PgPool = Pool<ConnectionManager<PgConnection>>;

/// The queue's migrations (this crate's `migrations/`), embedded.
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// Advisory lock key held while migrating, so worker pools and APIs that start together
/// do not race to create the same tables.
const MIGRATION_LOCK_KEY: i64 = 0x6f75_7462_6f78; // "outbox"

/// How long a caller waits for a pooled connection before the request fails
/// (the API turns that into a 503 instead of hanging).
pub(crate) const DEFAULT_CHECKOUT_TIMEOUT: Duration = Duration::from_secs(5);

/// What [`build_pool`] builds.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// Most connections the pool holds (at least 1; 0 is taken as 1).
    /// Opened on demand, none kept idle. Default 10.
    pub size: u32,
    /// Ping each connection before handing it out. An API wants that (a
    /// request should not fail on a connection that died while idle); a worker pool
    /// does not, since a ping would double the round trips of its hot loop
    /// and a failed claim is simply retried (Diesel marks the broken
    /// connection and r2d2 drops it). A pool that leaves this off can still
    /// ping per call: [`run_blocking_pinged`] pings, [`run_blocking_retried`]
    /// does not. Default `false`.
    pub validate_on_checkout: bool,
    /// How long a checkout waits for a connection (including opening one)
    /// before it fails with [`DbError::Unavailable`]. Default
    /// 5 s; at least 1 ms.
    pub checkout_timeout: Duration,
    /// `statement_timeout` set on every connection the pool opens; `None`
    /// leaves the server's default. A bound here keeps a query stuck behind a
    /// lock from holding a pooled connection (and a blocking thread) forever.
    /// Sent in whole milliseconds, at least 1. Default `None`.
    pub statement_timeout: Option<Duration>,
    /// `lock_timeout` on every connection: how long a statement waits for a
    /// row or table lock before it fails. `None` (the default) leaves the
    /// server's.
    pub lock_timeout: Option<Duration>,
    /// `idle_in_transaction_session_timeout` on every connection: the server
    /// ends a session left idle inside a transaction, releasing its locks.
    /// `None` (the default) leaves the server's.
    pub idle_in_transaction_timeout: Option<Duration>,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            size: 10,
            validate_on_checkout: false,
            checkout_timeout: DEFAULT_CHECKOUT_TIMEOUT,
            statement_timeout: None,
            lock_timeout: None,
            idle_in_transaction_timeout: None,
        }
    }
}

/// Builds a pool as `options` say. Builds without connecting (no error if the
/// database is not up yet): connections are opened lazily, and `min_idle(0)`
/// keeps a restart of PostgreSQL from leaving the pool full of dead ones.
/// Each new connection runs the `SET`s of the timeouts given once, before its
/// first checkout.
pub fn build_pool(database_url: &str, options: &PoolOptions) -> PgPool {
    init_openssl();
    let manager = ConnectionManager::<PgConnection>::new(database_url);
    let mut builder = Pool::builder()
        .max_size(options.size.max(1))
        .min_idle(Some(0))
        // r2d2 panics on a zero timeout.
        .connection_timeout(options.checkout_timeout.max(Duration::from_millis(1)))
        .test_on_check_out(options.validate_on_checkout);
    let settings: Vec<String> = [
        ("statement_timeout", options.statement_timeout),
        ("lock_timeout", options.lock_timeout),
        (
            "idle_in_transaction_session_timeout",
            options.idle_in_transaction_timeout,
        ),
    ]
    .into_iter()
    // 0 would mean "no timeout" to PostgreSQL: the shortest is 1 ms.
    .filter_map(|(name, value)| value.map(|d| format!("SET {name} = {}", d.as_millis().max(1))))
    .collect();
    if !settings.is_empty() {
        builder = builder.connection_customizer(Box::new(SetTimeouts(settings.join("; "))));
    }
    builder.build_unchecked(manager)
}

/// The session timeouts, one SET statement each, run once per new connection.
#[derive(Debug)]
struct SetTimeouts(String);

impl diesel::r2d2::CustomizeConnection<PgConnection, diesel::r2d2::Error> for SetTimeouts {
    fn on_acquire(&self, conn: &mut PgConnection) -> Result<(), diesel::r2d2::Error> {
        use diesel::connection::SimpleConnection as _;
        conn.batch_execute(&self.0)
            .map_err(diesel::r2d2::Error::QueryError)
    }
}

/// Why [`establish`] could not connect, or a migration could not run.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The database did not accept a connection; `url` has its password hidden.
    #[error("connecting to {url}")]
    Connect {
        /// The URL, its password replaced by `***`.
        url: String,
        /// Diesel's reason.
        #[source]
        source: diesel::ConnectionError,
    },
    /// Taking or releasing the migration lock failed.
    #[error("{step} the migration lock")]
    Lock {
        /// `"taking"` or `"releasing"`.
        step: &'static str,
        /// The database's reason.
        #[source]
        source: diesel::result::Error,
    },
    /// A migration failed; it was rolled back.
    #[error("running migrations")]
    Migrate(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Applies this crate's pending migrations (the queue's tables) under an
/// advisory lock. Safe to call from many processes at once: the second
/// waits, then finds nothing to do. An application with migrations of its
/// own runs them with these through [`run_migration_sets`].
pub fn run_migrations(conn: &mut PgConnection) -> Result<(), SetupError> {
    run_migration_sets(conn, [MIGRATIONS])
}

/// Applies the pending migrations of each set, in order, under one advisory
/// lock, so that worker pools and services that start together do not race to
/// create the same tables.
pub fn run_migration_sets(
    conn: &mut PgConnection,
    sets: impl IntoIterator<Item = EmbeddedMigrations>,
) -> Result<(), SetupError> {
    sql_query("SELECT pg_advisory_lock($1)")
        .bind::<BigInt, _>(MIGRATION_LOCK_KEY)
        .execute(conn)
        .map_err(|source| SetupError::Lock {
            step: "taking",
            source,
        })?;
    let result = sets.into_iter().try_for_each(|set| {
        conn.run_pending_migrations(set)
            .map(|applied| {
                for version in applied {
                    tracing::info!(%version, "applied migration");
                }
            })
            .map_err(SetupError::Migrate)
    });
    sql_query("SELECT pg_advisory_unlock($1)")
        .bind::<BigInt, _>(MIGRATION_LOCK_KEY)
        .execute(conn)
        .map_err(|source| SetupError::Lock {
            step: "releasing",
            source,
        })?;
    result
}

/// Starts OpenSSL, which libpq's TLS runs on, without its exit-time cleanup.
///
/// By default OpenSSL frees its global state in an `atexit` handler when the
/// process exits. r2d2 opens connections on threads of its own, which no one
/// joins: a connect still in its TLS handshake when `main` returns then
/// touches freed state, and the process dies of SIGSEGV instead of exiting 0
/// (4 of 189 `serve`s stopped by SIGTERM right after they started, against a
/// server with `ssl = on`). The first initialisation decides for the
/// whole process, so [`build_pool`] and [`establish`] call this before any
/// connect; a binary should call it first thing in `main`. Idempotent and
/// cheap after the first call; the memory OpenSSL keeps is the kernel's to
/// free at exit.
pub fn init_openssl() {
    openssl_sys::init();
}

/// One connection, with an error that names the database (password hidden).
pub fn establish(database_url: &str) -> Result<PgConnection, SetupError> {
    use diesel::Connection as _;
    init_openssl();
    PgConnection::establish(database_url).map_err(|source| SetupError::Connect {
        url: redact_url(database_url),
        source,
    })
}

/// Runs `f` with a pooled connection on tokio's blocking thread pool, inside
/// the caller's tracing span, and returns its result. A checkout that times
/// out is [`DbError::Unavailable`]; a panic in `f` (or a runtime shutting
/// down) is [`DbError::Task`]. `f` runs to completion even if the returned
/// future is dropped: a statement already sent is not cancelled.
pub async fn run_blocking<T, F>(pool: &PgPool, f: F) -> Result<T, DbError>
where
    F: FnOnce(&mut PgConnection) -> Result<T, DbError> + Send + 'static,
    T: Send + 'static,
{
    let pool = pool.clone();
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || {
        let _entered = span.enter();
        let mut conn = pool
            .get()
            .map_err(|e| DbError::Unavailable(e.to_string()))?;
        let result = f(&mut conn);
        if let Err(error) = &result
            && must_discard(error)
        {
            discard(&mut conn);
        }
        result
    })
    .await
    .map_err(|e| DbError::Task(e.to_string()))?
}

/// A URL as logs and error messages may show it: any password replaced by
/// `***` (in the user part or as a `password` parameter); an unparsable one not
/// shown at all, since it may still hold a password. For database and SMTP URLs
/// alike, including libpq's multi-host form (`postgres://u:p@h1:5432,h2:5433/db`),
/// which is not a URL to the `url` crate.
pub fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut parsed) => {
            if parsed.password().is_some() {
                let _ = parsed.set_password(Some("***"));
            }
            let query = parsed.query().map(redact_query);
            parsed.set_query(query.as_deref());
            parsed.to_string()
        }
        Err(_) => {
            redact_multi_host(raw).unwrap_or_else(|| "(unparsable URL, not shown)".to_owned())
        }
    }
}

/// [`redact_url`] for `scheme://[user[:password]@]host[:port],host[:port]…[/db][?query]`.
fn redact_multi_host(raw: &str) -> Option<String> {
    let (scheme, rest) = raw.split_once("://")?;
    // The user part ends at the last `@` before the query, so that a password
    // holding a raw `/` or `@` is hidden whole rather than cut and shown.
    let query_start = rest.find('?').unwrap_or(rest.len());
    let (userinfo, after_user) = match rest[..query_start].rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let hosts_end = after_user.find(['/', '?']).unwrap_or(after_user.len());
    let (hosts, tail) = after_user.split_at(hosts_end);
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (tail, None),
    };
    let userinfo = match userinfo {
        Some(userinfo) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***@"),
            None => format!("{userinfo}@"),
        },
        None => String::new(),
    };
    let query = query
        .map(|q| format!("?{}", redact_query(q)))
        .unwrap_or_default();
    Some(format!("{scheme}://{userinfo}{hosts}{path}{query}"))
}

/// The libpq connection parameters whose value is a secret (the others name
/// files, modes or hosts).
const SECRET_PARAMETERS: [&str; 3] = ["password", "sslpassword", "oauth_client_secret"];

/// A query string with the value of every secret parameter replaced by
/// `***`. libpq percent-decodes parameter names, so `pass%77ord` is a
/// password too; names are compared decoded and without regard to case.
fn redact_query(query: &str) -> String {
    query
        .split('&')
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let decoded: String = url::form_urlencoded::parse(key.as_bytes())
                .next()
                .map(|(name, _)| name.into_owned())
                .unwrap_or_default();
            let secret = SECRET_PARAMETERS
                .iter()
                .any(|name| decoded.trim().eq_ignore_ascii_case(name));
            if secret && !value.is_empty() {
                format!("{key}=***")
            } else {
                pair.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_url_hides_every_libpq_secret_in_any_encoding() {
        for (raw, secret) in [
            ("postgres://u@h/db?pass%77ord=s3cret", "s3cret"),
            (
                "postgres://u@h/db?%70%61%73%73%77%6F%72%64=s3cret",
                "s3cret",
            ),
            ("postgres://u@h/db?PASSWORD=s3cret", "s3cret"),
            ("postgres://u@h/db?sslmode=require&sslpassword=k3y", "k3y"),
            ("postgres://u@h/db?ssl%70assword=k3y", "k3y"),
            ("postgres://u@h/db?oauth_client_secret=0auth", "0auth"),
            (
                "postgresql://h1,h2/db?pass%77ord=s3cret&sslpassword=k3y",
                "s3cret",
            ),
            (
                "postgresql://h1,h2/db?pass%77ord=s3cret&sslpassword=k3y",
                "k3y",
            ),
        ] {
            let shown = redact_url(raw);
            assert!(!shown.contains(secret), "{raw} shown as {shown}");
            assert!(shown.contains("=***"), "{shown}");
        }
        assert_eq!(
            redact_url("postgres://u@h/db?sslmode=require&passfile=/run/pgpass"),
            "postgres://u@h/db?sslmode=require&passfile=/run/pgpass"
        );
    }

    #[test]
    fn redact_url_hides_the_password_of_a_multi_host_url() {
        assert_eq!(
            redact_url(
                "postgres://app:s3cret@10.0.0.1:5432,10.0.0.2:5433/queue?target_session_attrs=read-write"
            ),
            "postgres://app:***@10.0.0.1:5432,10.0.0.2:5433/queue?target_session_attrs=read-write"
        );
        assert_eq!(
            redact_url("postgresql://h1,h2/db?password=s3cret&sslmode=require"),
            "postgresql://h1,h2/db?password=***&sslmode=require"
        );
        assert_eq!(redact_url("postgres://u:p@a/db"), "postgres://u:***@a/db");
        assert_eq!(
            redact_url("postgres://u@a/db?password=x"),
            "postgres://u@a/db?password=***"
        );
        assert!(!redact_url("not a url : s3cret").contains("s3cret"));
        let raw_slash = redact_url("postgres://u:s3/cr@t@h1,h2/db");
        assert_eq!(raw_slash, "postgres://u:***@h1,h2/db");
    }
}
