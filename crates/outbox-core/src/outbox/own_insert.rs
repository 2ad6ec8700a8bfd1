//! Jobs an application inserts in a statement of its own, past
//! [`Enqueuer::enqueue_many`]: for a hot path whose round trips are its cost
//! (the order service places an order, its rows and its jobs, in one
//! statement that needs no transaction around it). Such a statement writes
//! the rows the enqueue would write (the columns of
//! [`queue_row!`](crate::queue_row), ordering and concurrency keys,
//! dependencies), and its application's tests hold it to them; an
//! [`OwnInsert`] gives it what only the enqueuer knows: the trace context to
//! store, and how the worker pools hear of the jobs.

use diesel::PgConnection;

use super::enqueue::{AfterCommit, in_transaction};
use super::{Enqueuer, NOTIFY_CHANNEL, Waker};

/// What a statement that inserts jobs itself needs from its [`Enqueuer`]:
/// made by [`Enqueuer::own_insert`] just before the statement runs, told by
/// [`OwnInsert::inserted`] once it has.
#[derive(Debug)]
#[must_use = "call `inserted` once the statement has run: a worker pool woken after commit hears of its jobs then"]
pub struct OwnInsert {
    wake: Wake,
    trace_context: Option<serde_json::Value>,
}

/// How the worker pools hear of the statement's jobs: as
/// [`Enqueuer::enqueue_many`] would have them hear in the same place.
#[derive(Debug)]
enum Wake {
    /// A NOTIFY per kind in the statement, delivered when it commits: an
    /// enqueuer without a waker, or a transaction the enqueuer did not open.
    InStatement,
    /// The statement is its own transaction: once it has run, it has
    /// committed.
    Now(Waker),
    /// Inside an [`Enqueuer::transaction`]: once that one commits.
    AtCommit(Waker),
}

impl Enqueuer {
    /// Prepares a statement of the caller's that inserts jobs itself on
    /// `conn`, in whatever transaction `conn` is in; outside one the
    /// statement is its own transaction, and needs no BEGIN and COMMIT
    /// around it. Call it just before the statement (it takes the current
    /// span's trace context), and [`OwnInsert::inserted`] once the
    /// statement has run without error.
    pub fn own_insert(&self, conn: &mut PgConnection) -> OwnInsert {
        let wake = match &self.waker {
            Some(waker) if in_transaction(conn) => {
                if AfterCommit::is_open(waker) {
                    Wake::AtCommit(waker.clone())
                } else {
                    Wake::InStatement
                }
            }
            _ => return self.own_insert_alone(),
        };
        OwnInsert {
            wake,
            trace_context: crate::trace_context::current(),
        }
    }

    /// [`Enqueuer::own_insert`] for a statement sent outside any transaction
    /// on a connection that is not Diesel's (a tokio-postgres client's): the
    /// statement is its own transaction.
    pub fn own_insert_alone(&self) -> OwnInsert {
        let wake = match &self.waker {
            None => Wake::InStatement,
            Some(waker) => Wake::Now(waker.clone()),
        };
        OwnInsert {
            wake,
            trace_context: crate::trace_context::current(),
        }
    }
}

impl OwnInsert {
    /// The channel the statement must NOTIFY, once per distinct kind it
    /// inserts, the kind as the payload (`SELECT pg_notify(channel, kind)`):
    /// PostgreSQL delivers it when the statement's transaction commits.
    /// `None` when the enqueuer wakes the worker pools after commit
    /// ([`Enqueuer::wake_after_commit`]): then the statement sends none, so
    /// its commit never queues on PostgreSQL's notify lock.
    pub fn notify_channel(&self) -> Option<&'static str> {
        matches!(self.wake, Wake::InStatement).then_some(NOTIFY_CHANNEL)
    }

    /// `jobs.trace_context` of every job the statement inserts: the span's
    /// current when [`Enqueuer::own_insert`] was called, as
    /// [`NewJob::new`](super::NewJob::new) takes it.
    pub fn trace_context(&self) -> Option<&serde_json::Value> {
        self.trace_context.as_ref()
    }

    /// The statement ran without error and inserted jobs of `kinds`: wakes
    /// their worker pools now (the statement was its own transaction, and
    /// committed), or once the [`Enqueuer::transaction`] it ran in commits.
    /// A statement that failed wakes no one: drop this instead.
    pub fn inserted<'a>(self, kinds: impl IntoIterator<Item = &'a str>) {
        match self.wake {
            Wake::InStatement => {}
            Wake::Now(waker) => waker.wake(kinds),
            Wake::AtCommit(waker) => {
                let kinds: Vec<&str> = kinds.into_iter().collect();
                // The frame was open when the statement began, and is the
                // transaction's it ran in; were it gone, a wake now costs
                // at most a claim that finds nothing yet.
                if !AfterCommit::record(&waker, kinds.iter().copied()) {
                    waker.wake(kinds);
                }
            }
        }
    }
}
