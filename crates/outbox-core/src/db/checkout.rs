//! How a checkout makes sure its connection is alive, chosen per call.
//!
//! r2d2's own checkout test pings every connection it hands out, a round
//! trip before every piece of work. That is what a write needs: once the
//! ping has answered, a failure of the write is the write's, not that of a
//! connection that died while idle in the pool. A read (or anything else
//! that is safe to run twice) can skip it: run it, and only when it fails
//! and its connection turns out to be dead, run it once more on another
//! connection. Both keep the promise that a request does not fail on a
//! connection that died while idle; the second pays the ping only then.
//! The order API's key check runs before every request's own work, so this
//! takes one round trip off every authenticated request.

use std::time::Instant;

use diesel::PgConnection;
use diesel::r2d2::{ConnectionManager, PooledConnection, R2D2Connection as _};

use super::{DbError, PgPool, discard};

/// A pooled connection, as [`checkout`] hands it out.
type PooledPg = PooledConnection<ConnectionManager<PgConnection>>;

/// How [`run_blocking_checked`] makes sure of its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checkout {
    /// A ping before the work, unless the pool's own checkout test pings
    /// already; a connection that does not answer is dropped and another
    /// taken. For work that must not run twice.
    Pinged,
    /// No ping. When the work fails with an error its caller says may be the
    /// connection's, and the connection then does not answer a ping, it is
    /// dropped and the work runs once more on a pinged connection. For work
    /// that is safe to run twice: a read, a NOTIFY.
    Retried,
}

/// Takes a connection from `pool`, pinged when `how` is [`Checkout::Pinged`]
/// and the pool does not test its checkouts itself. Waits at most the
/// pool's connection timeout in all, however many dead connections it drops
/// on the way.
fn checkout(pool: &PgPool, how: Checkout) -> Result<PooledPg, DbError> {
    let deadline = Instant::now() + pool.connection_timeout();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut conn = pool
            .get_timeout(left)
            .map_err(|e| DbError::Unavailable(e.to_string()))?;
        if how == Checkout::Retried || pool.test_on_check_out() {
            return Ok(conn);
        }
        match conn.ping() {
            Ok(()) => return Ok(conn),
            Err(error) => {
                tracing::debug!(%error, "a pooled connection did not answer its ping; taking another");
                discard(&mut conn);
                if Instant::now() >= deadline {
                    return Err(DbError::Unavailable(format!(
                        "no live connection within the checkout timeout: {error}"
                    )));
                }
            }
        }
    }
}

/// Runs `work` on a connection of `pool` on tokio's blocking thread pool,
/// inside the caller's tracing span, checked out as `how` says. With
/// [`Checkout::Retried`], `work` runs a second time only when its first
/// run failed with an error `may_be_the_connection` accepts and its
/// connection no longer answers a ping; never a third time.
///
/// The outer error is the checkout's (a timeout is
/// [`DbError::Unavailable`]) or the task's ([`DbError::Task`]); the inner
/// one is `work`'s own.
pub async fn run_blocking_checked<T, E, F>(
    pool: &PgPool,
    how: Checkout,
    may_be_the_connection: fn(&E) -> bool,
    mut work: F,
) -> Result<Result<T, E>, DbError>
where
    F: FnMut(&mut PgConnection) -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: Send + 'static,
{
    let pool = pool.clone();
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || {
        let _entered = span.enter();
        let mut conn = checkout(&pool, how)?;
        let first = work(&mut conn);
        match first {
            Err(error)
                if how == Checkout::Retried
                    && may_be_the_connection(&error)
                    && conn.ping().is_err() =>
            {
                tracing::debug!(
                    "a pooled connection was found dead under a read; reading again on another"
                );
                discard(&mut conn);
                drop(conn);
                let mut conn = checkout(&pool, Checkout::Pinged)?;
                Ok(work(&mut conn))
            }
            first => Ok(first),
        }
    })
    .await
    .map_err(|e| DbError::Task(e.to_string()))?
}
