//! outbox-core: a transactional outbox and job queue on PostgreSQL.
//!
//! Enqueue a job inside your own Diesel transaction ([`outbox::Enqueuer`]):
//! it commits or vanishes with your writes. A [`worker_pool::WorkerPool`] claims due jobs
//! with `FOR UPDATE SKIP LOCKED`, hands each to the [`worker::Worker`]
//! registered for its kind, and records the outcome with a fenced update, so a
//! worker that lost its lease changes nothing. Failures retry with exponential
//! backoff and jitter; a job gives up after its `max_attempts`; leases of a
//! crashed worker are reaped. Jobs that share an ordering key run one at a
//! time, in enqueue order.
//!
//! The crate knows nothing of what the jobs do: an application defines its
//! job types ([`worker::JobArgs`]) and workers, and may add columns of its own
//! to the `jobs` table. ARCHITECTURE.md, at the root of the repository, follows
//! a job through these modules and lists every statement that moves it.
//!
//! # Layout
//!
//! - [`worker`]: typed job arguments, workers, the registry that routes a
//!   claimed job to its worker, and the error classes.
//! - [`outbox`]: the jobs table: enqueue (now, at a time, or periodically:
//!   [`outbox::PeriodicJob`]), cancel in the caller's transaction, the job's
//!   status, operator actions (retry, cancel, blocked keys, prune, stats). Its SQL lives in
//!   `src/outbox/sql/`, one statement a file.
//! - [`statements`]: the worker pool's statements (claim, finish, heartbeat, reap),
//!   public for benchmarks and tests of one statement; not for applications.
//! - [`worker_pool`]: the worker pool: producer, executor, completer, heartbeat,
//!   reaper, LISTEN/NOTIFY wake-ups (over TLS too), graceful shutdown, and the
//!   retry policy.
//! - [`db`]: the r2d2 pool, this crate's embedded migrations, running Diesel
//!   off the async threads, and what a database error means for a retry.
//! - [`schema`]: the Diesel tables of the queue.
//! - [`dedupe`]: the outbox's twin: record a received message's id inside
//!   the transaction that applies it, and know a repeat.
//!
//! Every enqueue stores the W3C trace context of the current span with its
//! job (when the subscriber has `tracing-opentelemetry`'s layer), and the
//! worker pool's span for the job continues it (`src/trace_context.rs`).
#![warn(missing_docs)]

pub mod db;
pub mod dedupe;
pub mod outbox;
pub mod statements;
pub mod worker_pool;
// Diesel's `table!` generates items it cannot document.
#[allow(missing_docs)]
pub mod schema;
mod trace_context;
pub mod worker;

/// What [`queue_row!`] expands to names, whatever the caller's own
/// dependencies are called. Not an API.
#[doc(hidden)]
pub mod __private {
    pub use chrono;
    pub use serde_json;
}

/// Locks `mutex`, past a poison: for the mutexes here, whose state is only
/// ever changed by plain assignments, so a panic while one was held cannot
/// have left it half-changed.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
