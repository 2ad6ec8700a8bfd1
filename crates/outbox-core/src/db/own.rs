//! Connections of one's own beside the pool, for statements on a hot path.
//!
//! Each is a tokio-postgres connection opened from `DATABASE_URL` (TLS as
//! libpq reads it), with the pool's session timeouts and its statements
//! prepared once when it opens. The calls given the same slot share its
//! connection: tokio-postgres pipelines them, so none waits for a thread or
//! a checkout, and each prepared statement runs in one round trip.
//!
//! The worker pool's hot path runs here (`worker_pool/connection.rs`), and
//! so do the order API's key check and placement. Where no connection can be
//! opened (a URL or TLS setting only libpq understands, say), a call gets
//! `None` and its caller runs the same statement on the pool through Diesel;
//! a warning says so once per outage, and a connection is tried again every
//! [`REOPEN_AFTER`].

use crate::lock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::sql_types::Text;
use diesel::{QueryableByName, RunQueryDsl as _};
use tokio_postgres::Client;

use super::failure::connection_unusable;
use super::{DbError, PgPool, run_blocking};

/// How long after a failed attempt to open a connection the statements stay
/// on the pool before one is tried again.
pub const REOPEN_AFTER: Duration = Duration::from_secs(5);
/// The longest one attempt to open a connection (TLS and prepares included)
/// may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);

/// What one of [`OwnConnections`] holds: its client, and whatever it
/// prepared on it.
pub trait OwnConnection: Send + Sync + 'static {
    /// The connection's client: a closed one is replaced on the next call.
    fn client(&self) -> &Client;
}

/// A fixed number of slots, each holding a connection once one was opened,
/// and opening another after it broke.
pub struct OwnConnections<C> {
    database_url: String,
    pool: PgPool,
    slots: Vec<tokio::sync::Mutex<Option<Arc<C>>>>,
    /// The longest a statement waits for its answer before its connection is
    /// taken for dead (a peer that went silent, a network that drops packets
    /// without a reset).
    deadline: Duration,
    /// Whose statements these are, for the log: "the relay's".
    whose: &'static str,
    /// The pool's session timeouts, as `SET` statements, read once.
    session: tokio::sync::OnceCell<String>,
    /// Until then, calls go to the pool without trying to open a connection.
    closed_until: Mutex<Option<Instant>>,
    /// The last attempt to open a connection failed (logged once per outage).
    on_pool: AtomicBool,
}

impl<C> std::fmt::Debug for OwnConnections<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnConnections")
            .field("whose", &self.whose)
            .field("slots", &self.slots.len())
            .finish_non_exhaustive()
    }
}

impl<C: OwnConnection> OwnConnections<C> {
    /// `slots` connections at most (one at least), to `database_url`, which
    /// `pool` was built from: its session timeouts are read there.
    pub fn new(
        pool: PgPool,
        database_url: String,
        slots: usize,
        deadline: Duration,
        whose: &'static str,
    ) -> Self {
        OwnConnections {
            database_url,
            pool,
            slots: (0..slots.max(1))
                .map(|_| tokio::sync::Mutex::new(None))
                .collect(),
            deadline,
            whose,
            session: tokio::sync::OnceCell::new(),
            closed_until: Mutex::new(None),
            on_pool: AtomicBool::new(false),
        }
    }

    /// How many connections there may be.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Runs `statement` on slot `slot`'s connection (modulo the slots),
    /// opened with `prepare` if it has none or a closed one; `None` when
    /// none could be had (the caller runs it on the pool). A connection that
    /// failed in a way that leaves it unusable is dropped, and the next call
    /// opens another.
    pub async fn run<T>(
        &self,
        slot: usize,
        prepare: impl AsyncFnOnce(Client) -> Result<C, DbError>,
        statement: impl AsyncFnOnce(&C) -> Result<T, tokio_postgres::Error>,
    ) -> Option<Result<T, DbError>> {
        let slot = slot % self.slots.len();
        let open = self.connection(slot, prepare).await?;
        let error = match tokio::time::timeout(self.deadline, statement(&open)).await {
            Ok(Ok(value)) => return Some(Ok(value)),
            Ok(Err(error)) if !connection_unusable(&error) => {
                return Some(Err(DbError::Server(error)));
            }
            Ok(Err(error)) => DbError::Server(error),
            Err(_) => DbError::Unavailable(format!(
                "no answer from the database within {}; reconnecting",
                humantime::format_duration(self.deadline)
            )),
        };
        let mut held = self.slots[slot].lock().await;
        if held.as_ref().is_some_and(|h| Arc::ptr_eq(h, &open)) {
            *held = None;
        }
        Some(Err(error))
    }

    /// The slot's connection, opened if it has none (or a closed one).
    async fn connection(
        &self,
        slot: usize,
        prepare: impl AsyncFnOnce(Client) -> Result<C, DbError>,
    ) -> Option<Arc<C>> {
        let mut held = self.slots[slot].lock().await;
        if let Some(open) = held.as_ref()
            && !open.client().is_closed()
        {
            return Some(Arc::clone(open));
        }
        *held = None;
        let now = Instant::now();
        if lock(&self.closed_until).is_some_and(|until| now < until) {
            return None;
        }
        let opened = match tokio::time::timeout(OPEN_TIMEOUT, self.open(prepare)).await {
            Ok(opened) => opened,
            Err(_) => Err(DbError::Unavailable(format!(
                "opening a connection took over {}",
                humantime::format_duration(OPEN_TIMEOUT)
            ))),
        };
        match opened {
            Ok(open) => {
                *lock(&self.closed_until) = None;
                if self.on_pool.swap(false, Ordering::AcqRel) {
                    tracing::info!(
                        "{} statements run on their own connections again",
                        self.whose
                    );
                }
                let open = Arc::new(open);
                *held = Some(Arc::clone(&open));
                Some(open)
            }
            Err(error) => {
                *lock(&self.closed_until) = Some(now + REOPEN_AFTER);
                if !self.on_pool.swap(true, Ordering::AcqRel) {
                    tracing::warn!(
                        error = %error,
                        "cannot open a database connection for {} statements; they run on the pool until one opens",
                        self.whose
                    );
                }
                None
            }
        }
    }

    async fn open(
        &self,
        prepare: impl AsyncFnOnce(Client) -> Result<C, DbError>,
    ) -> Result<C, DbError> {
        let session = self
            .session
            .get_or_try_init(|| session_settings(&self.pool))
            .await?;
        let (client, connection) = crate::worker_pool::open_connection(&self.database_url)
            .await
            .map_err(|error| DbError::Unavailable(format!("{error:#}")))?;
        let whose = self.whose;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(error = %DbError::Server(error), "{whose} connection closed");
            }
        });
        if !session.trim().is_empty() {
            client.batch_execute(session).await?;
        }
        prepare(client).await
    }
}

#[derive(QueryableByName)]
struct Setting {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    setting: String,
}

/// The pool's session timeouts (`PoolOptions`), as `SET` statements for the
/// connections of one's own: a statement stuck behind a lock must give up
/// there as it does on the pool. Read from a pooled connection, so whatever
/// set them (the pool's options, the role's or the database's defaults)
/// holds alike.
async fn session_settings(pool: &PgPool) -> Result<String, DbError> {
    let settings: Vec<Setting> = run_blocking(pool, |conn| {
        Ok(diesel::sql_query(
            "SELECT name, setting FROM pg_settings \
             WHERE name IN ('statement_timeout', 'lock_timeout', \
                            'idle_in_transaction_session_timeout') \
             ORDER BY name",
        )
        .load(conn)?)
    })
    .await?;
    // pg_settings gives them in milliseconds, the unit these settings take
    // when none is written.
    Ok(settings
        .iter()
        .filter(|s| s.setting.bytes().all(|b| b.is_ascii_digit()))
        .map(|s| format!("SET {} = {};", s.name, s.setting))
        .collect::<Vec<_>>()
        .join(" "))
}

/// `statement`'s rows, read into a vector sized for `expected` of them.
/// tokio-postgres's `query` collects its rows into a vector that starts
/// empty and doubles, copying them each time: for a claim of 256 jobs, nine
/// growths. Sized here, with the claim's jobs sized too, the relay ran 3 to
/// 4% fewer instructions a no-op job (callgrind; docs/performance.md).
pub(crate) async fn query_expecting(
    client: &Client,
    statement: &tokio_postgres::Statement,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    expected: usize,
) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    use futures_util::TryStreamExt as _;
    let stream = client.query_raw(statement, params.iter().copied()).await?;
    let mut stream = std::pin::pin!(stream);
    let mut rows = Vec::with_capacity(expected);
    while let Some(row) = stream.try_next().await? {
        rows.push(row);
    }
    Ok(rows)
}
