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
//! takes one round trip off every authenticated request: it runs through
//! [`run_blocking_retried`], placements through [`run_blocking_pinged`].

use std::time::Instant;

use diesel::PgConnection;
use diesel::r2d2::{ConnectionManager, PooledConnection, R2D2Connection as _};

use super::{DbError, PgPool, discard};

/// A pooled connection, as [`checkout`] hands it out.
type PooledPg = PooledConnection<ConnectionManager<PgConnection>>;

/// Takes a connection from `pool`, pinged when `ping` is set and the pool
/// does not test its checkouts itself; a connection that does not answer is
/// dropped and another taken. Waits at most the pool's connection timeout in
/// all, however many dead connections it drops on the way.
fn checkout(pool: &PgPool, ping: bool) -> Result<PooledPg, DbError> {
    let deadline = Instant::now() + pool.connection_timeout();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut conn = pool
            .get_timeout(left)
            .map_err(|e| DbError::Unavailable(e.to_string()))?;
        if !ping || pool.test_on_check_out() {
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

/// Runs `call` with `pool` on tokio's blocking thread pool, inside the
/// caller's tracing span.
async fn blocking<R, C>(pool: &PgPool, call: C) -> Result<R, DbError>
where
    C: FnOnce(&PgPool) -> Result<R, DbError> + Send + 'static,
    R: Send + 'static,
{
    let pool = pool.clone();
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || {
        let _entered = span.enter();
        call(&pool)
    })
    .await
    .map_err(|e| DbError::Task(e.to_string()))?
}

/// Runs `work` on a connection of `pool` that answered a ping first (unless
/// the pool's own checkout test pinged it): for work that must not run
/// twice, a placement or a transition. A failure of `work` is then its own,
/// not that of a connection that died while idle.
///
/// The outer error is the checkout's (a timeout is
/// [`DbError::Unavailable`]) or the task's ([`DbError::Task`]); the inner
/// one is `work`'s own.
pub async fn run_blocking_pinged<T, E, F>(pool: &PgPool, work: F) -> Result<Result<T, E>, DbError>
where
    F: FnOnce(&mut PgConnection) -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: Send + 'static,
{
    blocking(pool, move |pool| {
        let mut conn = checkout(pool, true)?;
        Ok(work(&mut conn))
    })
    .await
}

/// Runs `work`, which must be safe to run twice (a read, a NOTIFY), on a
/// connection of `pool` without a ping first. Should its first run fail with
/// an error `may_be_the_connection` accepts, on a connection that then does
/// not answer a ping, it runs a second time, on a pinged connection; never a
/// third. Errors as [`run_blocking_pinged`]'s.
pub async fn run_blocking_retried<T, E, F>(
    pool: &PgPool,
    may_be_the_connection: fn(&E) -> bool,
    mut work: F,
) -> Result<Result<T, E>, DbError>
where
    F: FnMut(&mut PgConnection) -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: Send + 'static,
{
    blocking(pool, move |pool| {
        let mut conn = checkout(pool, false)?;
        match work(&mut conn) {
            Err(error) if may_be_the_connection(&error) && conn.ping().is_err() => {
                tracing::debug!(
                    "a pooled connection was found dead under its work; running it again on another"
                );
                discard(&mut conn);
                drop(conn);
                let mut conn = checkout(pool, true)?;
                Ok(work(&mut conn))
            }
            first => Ok(first),
        }
    })
    .await
}
