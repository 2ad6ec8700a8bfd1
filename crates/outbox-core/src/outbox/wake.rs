//! Waking worker pools after commit, without a NOTIFY in the enqueuing transaction.
//!
//! PostgreSQL serialises the commits of every transaction that sent a NOTIFY
//! behind one cluster-wide lock, held through the commit's WAL flush. With a
//! NOTIFY in each enqueuing transaction (three rows of the application's and
//! three jobs each), 8 pgbench clients committed 870 of them a second against
//! 3,255 without it. A [`Waker`] moves the NOTIFY out: an
//! [`Enqueuer`](super::Enqueuer) built with
//! [`wake_after_commit`](super::Enqueuer::wake_after_commit) enqueues without
//! one and calls [`Waker::wake`] once its transaction has committed; a
//! background task sends one NOTIFY per kind for everything woken since its
//! last one, in a transaction of its own that does not wait for a WAL flush (a
//! lost wake-up costs a poll interval, nothing more), and never more often
//! than every [`Waker::MIN_GAP`]. Under load many enqueuing transactions share
//! one NOTIFY; an idle worker pool still hears of a job within a round trip of its
//! commit.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{Array, Text};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::NOTIFY_CHANNEL;
use crate::db::{DbError, PgPool, PrepareOnce as _, run_blocking_retried};

/// Sends coalesced NOTIFYs for jobs committed by this process. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Waker {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    kinds: Mutex<BTreeSet<String>>,
    signal: Notify,
}

impl Waker {
    /// The shortest time between two NOTIFYs. Short next to the worker pools' own
    /// claim round trip, long enough that a busy API sends a few hundred
    /// NOTIFYs a second at most, whatever its enqueue rate.
    pub(crate) const MIN_GAP: Duration = Duration::from_millis(1);

    /// A waker whose NOTIFYs nobody sends until [`Waker::run`] runs.
    pub fn new() -> Waker {
        Waker::default()
    }

    /// Sends the NOTIFYs over `pool` until `shutdown`, then a last one for
    /// anything woken before it. Spawn it once per waker.
    pub async fn run(self, pool: PgPool, shutdown: CancellationToken) {
        run(self.inner, pool, shutdown).await;
    }

    /// Asks for worker pools of `kinds` to be woken. Call it after the transaction
    /// that enqueued the jobs committed: a worker pool woken earlier would not see
    /// them. Never blocks; callable from blocking threads.
    pub(crate) fn wake<'a>(&self, kinds: impl IntoIterator<Item = &'a str>) {
        let mut pending = self
            .inner
            .kinds
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        pending.extend(kinds.into_iter().map(str::to_owned));
        drop(pending);
        self.inner.signal.notify_one();
    }

    /// True when `other` is a clone of this waker.
    pub(super) fn same_as(&self, other: &Waker) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

async fn run(inner: Arc<Inner>, pool: PgPool, shutdown: CancellationToken) {
    loop {
        let stopping = tokio::select! {
            () = inner.signal.notified() => false,
            () = shutdown.cancelled() => true,
        };
        let kinds: Vec<String> =
            std::mem::take(&mut *inner.kinds.lock().unwrap_or_else(PoisonError::into_inner))
                .into_iter()
                .collect();
        if !kinds.is_empty() {
            // A NOTIFY sent twice wakes a worker pool twice, which is
            // harmless: no ping first, and once more on another connection if
            // this one had died while idle.
            let sent = run_blocking_retried(&pool, DbError::is_unavailable, move |conn| {
                diesel::sql_query(include_str!("sql/notify_kinds.sql"))
                    .bind::<Text, _>(NOTIFY_CHANNEL)
                    .bind::<Array<Text>, _>(&kinds)
                    .prepared()
                    .execute(conn)
                    .map_err(DbError::from)
            })
            .await
            .and_then(|sent| sent);
            if let Err(error) = sent {
                // The worker pools' poll picks the jobs up; say why they were slower.
                tracing::warn!(error = %error, "could not notify relays of new jobs; they will find them at their next poll");
            }
        }
        if stopping {
            return;
        }
        tokio::time::sleep(Waker::MIN_GAP).await;
    }
}
