//! The order service's database: the queue core's pool and helpers, and the
//! service's own migration, which runs after the core's.

use diesel::pg::PgConnection;
use diesel_migrations::{EmbeddedMigrations, embed_migrations};
pub use outbox_core::db::{
    DbError, Failure, OwnConnection, OwnConnections, PgPool, PoolOptions, PrepareOnce, build_pool,
    establish, init_openssl, prepare_insert, redact_url, run_blocking, run_blocking_pinged,
    run_blocking_retried,
};

/// The service's migrations (`migrations/`): its own tables (orders, their
/// items and events, receipts, endpoints, keys, sources, the dashboard's),
/// and its columns of the core's tables (`order_id` of `jobs` and
/// `jobs_done`, the payment columns of `inbox_messages`), which the core's
/// migrations create first.
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("../../migrations");

/// Applies the core's pending migrations, then the service's, under one
/// advisory lock. Safe to call from many processes at once.
pub fn run_migrations(conn: &mut PgConnection) -> anyhow::Result<()> {
    Ok(outbox_core::db::run_migration_sets(
        conn,
        [outbox_core::db::MIGRATIONS, MIGRATIONS],
    )?)
}

/// Connects once and migrates; used at the start of `serve`, `relay` and `demo`.
pub fn migrate_url(database_url: &str) -> anyhow::Result<()> {
    run_migrations(&mut establish(database_url)?)
}

/// libpq's words, in a failed connection's message, for "this server is up
/// but not the primary": a standby refused by `target_session_attrs=read-write`
/// (`session is read-only`, `server is in hot standby mode`, and libpq 13's
/// `could not make a writable connection`), or a server that is starting,
/// stopping or recovering, as a promoted standby does for a moment (57P03).
const NO_PRIMARY_MESSAGES: [&str; 4] = [
    "session is read-only",
    "server is in hot standby mode",
    "could not make a writable connection",
    "the database system is ",
];

/// Whether `error` (from connecting) says the servers are there but none is a
/// writable primary: a failover under way, or a URL that lists only standbys.
pub fn is_no_primary(error: &anyhow::Error) -> bool {
    let text = format!("{error:#}");
    NO_PRIMARY_MESSAGES.iter().any(|m| text.contains(m))
}

/// [`migrate_url`], at the start of `serve`, `relay` and `migrate`, waiting as
/// long as `DATABASE_URL` reaches no writable server (only standbys, or a
/// failover under way): said once at WARN, then retried every few seconds
/// without a word until a primary answers. Any other error ends it. Returns
/// `false` when `shutdown` came first.
pub async fn migrate_when_writable(
    database_url: &str,
    shutdown: &tokio_util::sync::CancellationToken,
) -> anyhow::Result<bool> {
    const MAX_DELAY: std::time::Duration = std::time::Duration::from_secs(5);
    let mut delay = std::time::Duration::from_millis(250);
    let mut waiting = false;
    loop {
        let url = database_url.to_owned();
        match tokio::task::spawn_blocking(move || migrate_url(&url)).await? {
            Ok(()) => {
                if waiting {
                    tracing::info!("a writable database server answered; starting");
                }
                return Ok(true);
            }
            Err(error) if is_no_primary(&error) => {
                if !waiting {
                    tracing::warn!(
                        error = format!("{error:#}"),
                        "no writable database server among DATABASE_URL's hosts (only standbys, or a failover under way); waiting for a primary"
                    );
                    waiting = true;
                }
            }
            Err(error) => return Err(error),
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.cancelled() => return Ok(false),
        }
        delay = (delay * 2).min(MAX_DELAY);
    }
}

/// A log table that `jobs prune` ages with the done jobs: its name, the key
/// its batches are chosen by, and the time each row is aged by. Fixed names,
/// never input: they are written into the statement.
#[derive(Debug, Clone, Copy)]
pub struct AgedTable {
    pub table: &'static str,
    pub key: &'static str,
    pub time: &'static str,
    /// A condition under which an aged row still stays (SQL over the
    /// table's columns), or `None`.
    pub keep_while: Option<&'static str>,
}

impl AgedTable {
    /// Deletes the rows whose time is more than `older_than` ago, in batches
    /// of `batch` rows (short transactions); returns how many went.
    pub fn prune(
        &self,
        conn: &mut PgConnection,
        older_than: std::time::Duration,
        batch: i64,
    ) -> diesel::QueryResult<u64> {
        use diesel::RunQueryDsl as _;
        use diesel::sql_types::{BigInt, Timestamptz};
        let cutoff = chrono::Duration::from_std(older_than)
            .ok()
            .and_then(|age| chrono::Utc::now().checked_sub_signed(age))
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
        let AgedTable {
            table,
            key,
            time,
            keep_while,
        } = *self;
        let kept = keep_while.map_or(String::new(), |keep| format!(" AND NOT ({keep})"));
        let statement = format!(
            "DELETE FROM {table} WHERE {key} IN ( \
                 SELECT {key} FROM {table} WHERE {time} < $1{kept} LIMIT $2)"
        );
        let batch = batch.max(1);
        let mut total = 0u64;
        loop {
            let deleted = diesel::sql_query(&statement)
                .bind::<Timestamptz, _>(cutoff)
                .bind::<BigInt, _>(batch)
                .execute(conn)?;
            total += deleted as u64;
            if (deleted as i64) < batch {
                return Ok(total);
            }
        }
    }
}
