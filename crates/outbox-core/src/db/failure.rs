//! What a failed database call means: whether to wait for the database, try
//! again later, or give up on the statement.
//!
//! The worker pool's own statements run on tokio-postgres, which hands over the
//! server's SQLSTATE: those are classified by code, whatever language the
//! server writes its messages in. Diesel keeps the SQLSTATE of most errors to
//! itself (its `DatabaseErrorKind` maps a few codes, and the error information
//! is private), so an error from a Diesel statement that it did not map is
//! recognised by the server's primary message, which holds only for the default
//! English `lc_messages`. Those are the Diesel paths: the API, an outcome that
//! commits with a local write, the archive's partition upkeep, and the worker pool's
//! fallback while it cannot open connections of its own.

use tokio_postgres::error::SqlState;

/// Errors from getting a connection or running a query.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// No connection could be checked out of the pool within its checkout
    /// timeout ([`PoolOptions::checkout_timeout`](crate::db::PoolOptions::checkout_timeout)): the database is down or
    /// unreachable, or every connection stayed busy that long. Carries r2d2's
    /// message. [`DbError::failure`] calls it [`Failure::Unavailable`].
    #[error("no database connection available: {0}")]
    Unavailable(String),
    /// A connection was had, and Diesel or the server failed the query: a
    /// constraint, a timeout, a serialization failure, a connection that broke
    /// mid-query, a row that was not found. [`DbError::failure`] tells these
    /// apart.
    #[error(transparent)]
    Query(#[from] diesel::result::Error),
    /// A statement on the worker pool's own connection (tokio-postgres) failed, or
    /// that connection could not be opened. [`DbError::failure`] reads its
    /// SQLSTATE.
    #[error("{}", describe(.0))]
    Server(#[from] tokio_postgres::Error),
    /// The blocking task of [`run_blocking`](crate::db::run_blocking) panicked, or was cancelled before
    /// it started because the runtime is shutting down; carries the join
    /// error's message. After a panic, what the closure wrote is unknown. Counts as
    /// [`Failure::Rejected`], not as the database being unavailable.
    #[error("database task panicked or was cancelled: {0}")]
    Task(String),
}

/// What a failed database call means for whoever retries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The database could not be reached: the same call will work once it is back.
    Unavailable,
    /// The database refused this time for reasons of timing (a statement or
    /// lock timeout, a deadlock, a serialization failure): try again later.
    Transient,
    /// The database refused the statement itself (bad data, a constraint, a
    /// permission): the same call will fail the same way.
    Rejected,
}

impl DbError {
    /// How to treat this failure: by SQLSTATE for a statement on the worker pool's
    /// own connection; for Diesel's errors, by the kinds Diesel maps and, for
    /// the timeouts and the deadlock, by the server's English message (see
    /// the module's docs).
    pub fn failure(&self) -> Failure {
        use diesel::result::DatabaseErrorKind as Kind;
        if self.is_unavailable() {
            return Failure::Unavailable;
        }
        match self {
            DbError::Server(error) => match error.code() {
                Some(code) if is_transient(code) => Failure::Transient,
                _ => Failure::Rejected,
            },
            DbError::Query(diesel::result::Error::DatabaseError(Kind::SerializationFailure, _)) => {
                Failure::Transient
            }
            DbError::Query(diesel::result::Error::DatabaseError(_, info))
                if TRANSIENT_MESSAGES
                    .iter()
                    .any(|m| info.message().contains(m)) =>
            {
                Failure::Transient
            }
            _ => Failure::Rejected,
        }
    }

    /// True when this is PostgreSQL cancelling a statement that ran past
    /// `statement_timeout` (SQLSTATE 57014). Diesel 2.3 does not expose the
    /// SQLSTATE of this error (its `DatabaseErrorKind` maps only a few codes
    /// and the error information is private), so this reads the server's
    /// message.
    pub fn is_statement_timeout(&self) -> bool {
        match self {
            DbError::Query(diesel::result::Error::DatabaseError(_, info)) => {
                info.message().contains("statement timeout")
            }
            DbError::Server(error) => error.code() == Some(&SqlState::QUERY_CANCELED),
            _ => false,
        }
    }

    /// True when the database itself could not be reached (as opposed to a query
    /// that was rejected), i.e. when the caller should answer 503 or retry later.
    ///
    /// That includes a server that is no longer (or not yet) the primary: a
    /// read-only transaction (25006, which Diesel reports as
    /// `ReadOnlyTransaction`), and the server shutting down, crashing or
    /// recovering (57P01, 57P02, 57P03), which Diesel does not map and which
    /// are recognised by the server's message. During a failover these last
    /// until the pool reaches the new primary; they say nothing of the work.
    pub fn is_unavailable(&self) -> bool {
        match self {
            DbError::Unavailable(_) => true,
            DbError::Query(error) => server_unavailable(error),
            DbError::Server(error) => connection_unusable(error),
            DbError::Task(_) => false,
        }
    }
}

/// See [`DbError::is_unavailable`]. A `COMMIT` lost with its connection comes
/// back from Diesel as `RollbackErrorOnCommit` (the rollback it tried failed
/// too): that commit may or may not have landed, which only the statement's
/// fence can tell on the next try, so it is unavailability too.
fn server_unavailable(error: &diesel::result::Error) -> bool {
    use diesel::result::{DatabaseErrorKind as Kind, Error};
    match error {
        Error::DatabaseError(
            Kind::ClosedConnection | Kind::UnableToSendCommand | Kind::ReadOnlyTransaction,
            _,
        ) => true,
        Error::DatabaseError(_, info) => SERVER_GONE_MESSAGES
            .iter()
            .any(|m| info.message().contains(m)),
        Error::RollbackErrorOnCommit { commit_error, .. } => server_unavailable(commit_error),
        _ => false,
    }
}

/// Whether a statement on the worker pool's own connection failed because the
/// server is gone or cannot take it now: the connection is closed or broken
/// (no SQLSTATE: an I/O error, a TLS or connect failure, a timeout), or the
/// server said so: a connection exception (class 08), too many connections
/// (53300), a read-only transaction on a server that is no longer the primary
/// (25006), an administrator's or a crash's shutdown or a server still
/// starting (57P01, 57P02, 57P03). The connection is then dropped and another
/// opened, which `target_session_attrs` sends to the new primary.
pub(crate) fn connection_unusable(error: &tokio_postgres::Error) -> bool {
    let Some(code) = error.code() else {
        // Every refusal the server explains carries a code; an error without
        // one is the connection's own (closed, I/O, TLS, connect), unless a
        // value did not convert, which is our statement's fault.
        return error.is_closed() || !is_conversion(error);
    };
    code.code().starts_with("08")
        || [
            SqlState::TOO_MANY_CONNECTIONS,
            SqlState::READ_ONLY_SQL_TRANSACTION,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
        ]
        .contains(code)
}

/// A value that would not convert to or from its SQL type, or a row of
/// another shape than the statement's: tokio-postgres has no public kind for
/// these, and its own (English, fixed) text names them.
fn is_conversion(error: &tokio_postgres::Error) -> bool {
    let text = error.to_string();
    [
        "error serializing",
        "error deserializing",
        "invalid column",
        "query returned an unexpected",
        "expected ",
    ]
    .iter()
    .any(|prefix| text.starts_with(prefix))
}

/// Refusals about timing, not the statement: a statement or lock timeout
/// (57014, 55P03), a deadlock (40P01) or a serialization failure (40001).
fn is_transient(code: &SqlState) -> bool {
    [
        SqlState::QUERY_CANCELED,
        SqlState::LOCK_NOT_AVAILABLE,
        SqlState::T_R_DEADLOCK_DETECTED,
        SqlState::T_R_SERIALIZATION_FAILURE,
    ]
    .contains(code)
}

/// tokio-postgres shows only "db error" for the server's refusals: this shows
/// the server's message with its code, which a localized message keeps.
fn describe(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} {}: {}", db.severity(), db.code().code(), db.message()),
        None => match std::error::Error::source(error) {
            Some(source) => format!("{error}: {source}"),
            None => error.to_string(),
        },
    }
}

/// Server messages of the refusals that are about timing, not the statement,
/// for Diesel's errors (see the module's docs): 57014 (statement timeout),
/// 55P03 (lock timeout), 40P01 (deadlock).
const TRANSIENT_MESSAGES: [&str; 3] = [
    "canceling statement due to statement timeout",
    "canceling statement due to lock timeout",
    "deadlock detected",
];

/// Server messages of 57P01 (admin shutdown: a fast stop, a switchover),
/// 57P02 (crash shutdown) and 57P03 (cannot connect now: "the database system
/// is starting up", "is shutting down", "is in recovery mode", "is not yet
/// accepting connections"), for PostgreSQL's default English `lc_messages`.
const SERVER_GONE_MESSAGES: [&str; 3] = [
    "terminating connection due to administrator command",
    "terminating connection because of crash of another server process",
    "the database system is ",
];

/// Whether a connection that failed with `error` must leave the pool instead
/// of going back to it. A connection whose server went away is already marked
/// broken by Diesel (libpq no longer knows its transaction status); one on a
/// server that became read-only is healthy as far as libpq knows, and would
/// fail every write it is lent for.
pub(super) fn must_discard(error: &DbError) -> bool {
    matches!(error, DbError::Query(error) if server_unavailable(error))
}

/// Makes r2d2 drop `conn` when it is returned: Diesel reports a connection
/// left inside a transaction as broken, and r2d2 closes broken connections
/// instead of pooling them. (Diesel offers no other way to mark one broken.)
pub(super) fn discard(conn: &mut diesel::PgConnection) {
    use diesel::connection::{AnsiTransactionManager, TransactionManager as _};
    // On a dead connection this fails, and Diesel marks it broken anyway.
    let _ = AnsiTransactionManager::begin_transaction(conn);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_only_transaction_and_a_server_going_away_are_unavailability() {
        use diesel::result::{DatabaseErrorKind as Kind, Error};
        let error = |kind, message: &str| {
            DbError::Query(Error::DatabaseError(kind, Box::new(message.to_owned())))
        };
        let read_only = error(
            Kind::ReadOnlyTransaction,
            "cannot execute UPDATE in a read-only transaction",
        );
        assert_eq!(read_only.failure(), Failure::Unavailable);
        for message in [
            "terminating connection due to administrator command",
            "terminating connection because of crash of another server process",
            "the database system is in recovery mode",
            "the database system is shutting down",
        ] {
            assert_eq!(
                error(Kind::Unknown, message).failure(),
                Failure::Unavailable,
                "{message}"
            );
        }
        let lost_commit = DbError::Query(Error::RollbackErrorOnCommit {
            rollback_error: Box::new(Error::BrokenTransactionManager),
            commit_error: Box::new(Error::DatabaseError(
                Kind::ClosedConnection,
                Box::new("server closed the connection unexpectedly".to_owned()),
            )),
        });
        assert_eq!(lost_commit.failure(), Failure::Unavailable);
        assert_eq!(
            error(Kind::UniqueViolation, "duplicate key").failure(),
            Failure::Rejected
        );
        assert!(must_discard(&read_only));
        assert!(!must_discard(&DbError::Unavailable("timed out".into())));
    }
}
