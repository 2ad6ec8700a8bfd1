//! Connection pool, embedded migrations, and running Diesel off the async threads.
//!
//! Diesel is synchronous. Every query made from async code goes through
//! [`run_blocking`], which checks a connection out of the r2d2 pool inside
//! `spawn_blocking`, so a slow query never stalls a tokio worker thread.

use std::time::Duration;

use anyhow::Context as _;
use diesel::pg::PgConnection;
use diesel::r2d2::{ConnectionManager, Pool, PooledConnection};
use diesel::sql_types::BigInt;
use diesel::{RunQueryDsl, sql_query};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

pub type PgPool = Pool<ConnectionManager<PgConnection>>;
pub type PooledPg = PooledConnection<ConnectionManager<PgConnection>>;

pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// Advisory lock key held while migrating, so relays and APIs that start together
/// do not race to create the same tables.
const MIGRATION_LOCK_KEY: i64 = 0x6f75_7462_6f78; // "outbox"

/// How long a caller waits for a pooled connection before the request fails
/// (the API turns that into a 503 instead of hanging).
pub const DEFAULT_CHECKOUT_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors from getting a connection or running a query.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("no database connection available: {0}")]
    Unavailable(String),
    #[error(transparent)]
    Query(#[from] diesel::result::Error),
    #[error("database task panicked or was cancelled: {0}")]
    Task(String),
}

impl DbError {
    /// True when the database itself could not be reached (as opposed to a query
    /// that was rejected), i.e. when the caller should answer 503 or retry later.
    pub fn is_unavailable(&self) -> bool {
        match self {
            DbError::Unavailable(_) => true,
            DbError::Query(diesel::result::Error::DatabaseError(kind, _)) => matches!(
                kind,
                diesel::result::DatabaseErrorKind::ClosedConnection
                    | diesel::result::DatabaseErrorKind::UnableToSendCommand
            ),
            DbError::Query(_) | DbError::Task(_) => false,
        }
    }
}

/// Builds a pool of `size` connections. Connections are opened lazily, so a pool
/// can be built while the database is still starting; `min_idle(0)` keeps a
/// restart of PostgreSQL from leaving the pool full of dead connections.
///
/// `validate_on_checkout` pings each connection before handing it out. The API
/// wants that (a request should not fail on a connection that died while idle);
/// the relay does not, since a ping would double the round trips of its hot loop
/// and a failed claim is simply retried (Diesel marks the broken connection and
/// r2d2 drops it).
pub fn build_pool(database_url: &str, size: u32, validate_on_checkout: bool) -> PgPool {
    build_pool_with(
        database_url,
        &PoolOptions {
            size,
            validate_on_checkout,
            ..PoolOptions::default()
        },
    )
}

/// What [`build_pool_with`] builds.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    pub size: u32,
    pub validate_on_checkout: bool,
    /// How long a checkout waits for a connection (including opening one)
    /// before it fails with [`DbError::Unavailable`].
    pub checkout_timeout: Duration,
    /// `statement_timeout` set on every connection the pool opens; `None`
    /// leaves the server's default. A bound here keeps a query stuck behind a
    /// lock from holding a pooled connection (and a blocking thread) forever.
    pub statement_timeout: Option<Duration>,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            size: 10,
            validate_on_checkout: false,
            checkout_timeout: DEFAULT_CHECKOUT_TIMEOUT,
            statement_timeout: None,
        }
    }
}

/// [`build_pool`] with every knob.
pub fn build_pool_with(database_url: &str, options: &PoolOptions) -> PgPool {
    let manager = ConnectionManager::<PgConnection>::new(database_url);
    let mut builder = Pool::builder()
        .max_size(options.size.max(1))
        .min_idle(Some(0))
        // r2d2 panics on a zero timeout.
        .connection_timeout(options.checkout_timeout.max(Duration::from_millis(1)))
        .test_on_check_out(options.validate_on_checkout);
    if let Some(timeout) = options.statement_timeout {
        builder = builder.connection_customizer(Box::new(StatementTimeout(timeout)));
    }
    builder.build_unchecked(manager)
}

/// Sets `statement_timeout` once per new connection.
#[derive(Debug, Clone, Copy)]
struct StatementTimeout(Duration);

impl diesel::r2d2::CustomizeConnection<PgConnection, diesel::r2d2::Error> for StatementTimeout {
    fn on_acquire(&self, conn: &mut PgConnection) -> Result<(), diesel::r2d2::Error> {
        let millis = self.0.as_millis().max(1);
        sql_query(format!("SET statement_timeout = {millis}"))
            .execute(conn)
            .map(drop)
            .map_err(diesel::r2d2::Error::QueryError)
    }
}

/// True when `error` is PostgreSQL cancelling a statement that ran past
/// `statement_timeout` (SQLSTATE 57014). Diesel does not expose the SQLSTATE,
/// so this reads the server's (English) message.
pub fn is_statement_timeout(error: &DbError) -> bool {
    matches!(
        error,
        DbError::Query(diesel::result::Error::DatabaseError(_, info))
            if info.message().contains("statement timeout")
    )
}

/// Applies pending migrations under an advisory lock. Safe to call from many
/// processes at once: the second waits, then finds nothing to do.
pub fn run_migrations(conn: &mut PgConnection) -> anyhow::Result<()> {
    sql_query("SELECT pg_advisory_lock($1)")
        .bind::<BigInt, _>(MIGRATION_LOCK_KEY)
        .execute(conn)
        .context("taking the migration lock")?;
    let result = conn
        .run_pending_migrations(MIGRATIONS)
        .map(|applied| {
            for version in applied {
                tracing::info!(%version, "applied migration");
            }
        })
        .map_err(|e| anyhow::anyhow!("running migrations: {e}"));
    sql_query("SELECT pg_advisory_unlock($1)")
        .bind::<BigInt, _>(MIGRATION_LOCK_KEY)
        .execute(conn)
        .context("releasing the migration lock")?;
    result
}

/// Connects once and migrates; used at the start of `serve`, `relay` and `demo`.
pub fn migrate_url(database_url: &str) -> anyhow::Result<()> {
    use diesel::Connection as _;
    let mut conn = PgConnection::establish(database_url)
        .with_context(|| format!("connecting to {}", redact_url(database_url)))?;
    run_migrations(&mut conn)
}

/// Runs `f` with a pooled connection on the blocking thread pool.
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
        f(&mut conn)
    })
    .await
    .map_err(|e| DbError::Task(e.to_string()))?
}

/// The URL with any password replaced, for logs and error messages.
pub fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        Ok(parsed) => parsed.to_string(),
        Err(_) => "<unparsable database URL>".to_owned(),
    }
}
