//! What the handlers share, and the gate in front of the connection pool.

use std::sync::Arc;
use std::time::Duration;

use diesel::PgConnection;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::ApiSettings;
use super::direct::{ApiConnection, Direct};
use super::error::ApiError;
use super::health::Health;
use crate::db::{DbError, PgPool, run_blocking_pinged, run_blocking_retried};
use crate::outbox::Enqueuer;

#[derive(Debug, Clone)]
pub(crate) struct AppState {
    pub db: Db,
    pub settings: Arc<ApiSettings>,
    /// Writes the jobs of placements and transitions, and wakes the relays
    /// once each has committed.
    pub enqueuer: Enqueuer,
    /// `/inbound`'s sources and signature checks, apart from the pool.
    pub inbound: Arc<crate::inbox::source_cache::InboundGate>,
}

/// The pool behind a semaphore with one permit per connection.
///
/// A request waits for a permit here, asynchronously and for at most `wait`,
/// before it takes a blocking thread. So blocking threads busy with the
/// database never outnumber the connections: a burst of requests queues on
/// the semaphore (and gets a 503 after `wait`) instead of parking hundreds of
/// blocking threads on r2d2's checkout, and the blocking pool is sized by the
/// connection pool, whatever tokio's own limit is.
#[derive(Debug, Clone)]
pub(crate) struct Db {
    pool: PgPool,
    permits: Arc<Semaphore>,
    /// How long a request waits for a permit before it is answered 503.
    wait: Duration,
    /// What `/healthz` says: every call that reached the pool tells it.
    health: Arc<Health>,
    /// The API's own connections, for the key check and the placement.
    direct: Arc<Direct>,
}

impl Db {
    /// `pool`, and `direct` beside it for [`Db::direct`].
    pub fn new(pool: PgPool, direct: Direct, wait: Duration) -> Db {
        let permits = Arc::new(Semaphore::new(pool.max_size() as usize));
        Db {
            pool,
            permits,
            wait,
            health: Arc::new(Health::default()),
            direct: Arc::new(direct),
        }
    }

    pub fn health(&self) -> &Health {
        &self.health
    }

    /// Runs `f` with a connection on the blocking pool, pinged first
    /// ([`run_blocking_pinged`]): for work that must not run twice, a
    /// placement or a transition.
    ///
    /// The permit moves into the blocking task and is released when the task
    /// ends, not when the request does: a request that times out does not free
    /// a slot whose connection is still busy.
    pub async fn run<T, F>(&self, f: F) -> Result<T, ApiError>
    where
        F: FnOnce(&mut PgConnection) -> Result<T, ApiError> + Send + 'static,
        T: Send + 'static,
    {
        let permit = self.permit().await?;
        let outcome = run_blocking_pinged(&self.pool, move |conn| {
            let _permit = permit;
            f(conn)
        })
        .await;
        self.settle(outcome)
    }

    /// Runs `f`, which must be safe to run twice (a read, the key check),
    /// without a ping first ([`run_blocking_retried`]): should it fail because
    /// its connection had died while idle, it runs once more on another. Saves
    /// the ping's round trip on every call that finds its connection alive.
    pub async fn read<T, F>(&self, mut f: F) -> Result<T, ApiError>
    where
        F: FnMut(&mut PgConnection) -> Result<T, ApiError> + Send + 'static,
        T: Send + 'static,
    {
        let permit = self.permit().await?;
        let outcome = run_blocking_retried(&self.pool, connection_may_be_gone, move |conn| {
            // Held until the blocking task ends, its second run included.
            let _permit = &permit;
            f(conn)
        })
        .await;
        self.settle(outcome)
    }

    /// Runs `statement` on one of the API's own connections (`direct`),
    /// behind the same permits as the pool's calls; `None` when none of them
    /// could be opened: the caller runs its pool version. A statement that
    /// failed is not run again: it may have committed.
    pub async fn direct<T>(
        &self,
        statement: impl AsyncFnOnce(&ApiConnection) -> Result<T, tokio_postgres::Error>,
    ) -> Option<Result<T, ApiError>> {
        let _permit = match self.permit().await {
            Ok(permit) => permit,
            Err(error) => return Some(Err(error)),
        };
        let outcome = self.direct.run(statement).await?;
        Some(self.settle(outcome.map(Ok)))
    }

    /// A permit for one connection, waited for asynchronously.
    async fn permit(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        tokio::time::timeout(self.wait, Arc::clone(&self.permits).acquire_owned())
            .await
            .map_err(|_| ApiError::DatabaseUnavailable {
                cause: format!(
                    "all {} connections stayed busy for {}",
                    self.pool.max_size(),
                    humantime::format_duration(self.wait)
                ),
            })?
            .map_err(|e| ApiError::Internal(e.into()))
    }

    /// The answer of a call that got its permit, told to the health check
    /// (a wait for a permit says the API is busy, not that the database is
    /// down, so only what happened past it counts).
    fn settle<T>(&self, outcome: Result<Result<T, ApiError>, DbError>) -> Result<T, ApiError> {
        let outcome = outcome.map_err(ApiError::from).and_then(|result| result);
        match &outcome {
            Err(error @ ApiError::DatabaseUnavailable { .. }) => {
                self.health
                    .down(serde_json::to_value(error.body()).unwrap_or_default());
            }
            _ => self.health.up(),
        }
        outcome
    }
}

/// Whether a failed call may have failed for its connection: the errors
/// [`ApiError::from`] makes of an unreachable database.
fn connection_may_be_gone(error: &ApiError) -> bool {
    matches!(error, ApiError::DatabaseUnavailable { .. })
}
