//! The worker pool's own statements, one function each: claim, finish
//! (fenced), heartbeat, hand back, reap, and the upkeep of the archive's
//! partitions. The untyped handler the pool calls with each [`ClaimedJob`]
//! is `worker::JobHandler`.
//!
//! Public for benchmarks that time one statement alone and tests that drive
//! a job through its states by hand. An application never needs them (a
//! [`WorkerPool`](crate::worker_pool::WorkerPool) runs them), and they change
//! with the pool. Each runs on a connection the caller provides, in whatever
//! transaction it is in ([`HotStatements`] prepares the same statements on a
//! tokio-postgres connection, as the pool runs them); its SQL is in
//! `src/outbox/sql/`, one statement a file, with a comment on why it is safe
//! under many concurrent pools.

pub use crate::outbox::archive::ensure_done_partitions;
pub use crate::outbox::claim::{
    CLAIM_SQL, ClaimPosition, ClaimRequest, ClaimedJob, claim_jobs, claim_jobs_after,
};
pub use crate::outbox::claim_plan::{
    BY_KEY_PLANNING, CHECK_EVERY, ClaimPlan, ClaimPlanner, GENERIC_SHARE,
};
pub use crate::outbox::finish::{Finish, FinishReport, Outcome, finish_jobs};
pub use crate::outbox::lease::{HeartbeatReport, JobLease, extend_leases, hand_back_jobs};
pub use crate::outbox::ordering_keys::advance_stranded_keys;
pub use crate::outbox::prepared::{
    CLAIM_PARAMS, HOT_STATEMENT_FILES, HookStatements, HotStatements,
};
pub use crate::outbox::reap::{ReapReport, ReapRequest, reap_expired_leases};
pub use crate::outbox::text::MAX_ERROR_BYTES;
/// Opens a tokio-postgres connection as the worker pool's own connections
/// are opened: TLS as `database_url`'s `sslmode` (or `PGSSLMODE`) says,
/// `prefer` when neither does, as libpq. A benchmark setting plain loops
/// beside the pool connects with it, so both pay the same transport.
pub use crate::worker_pool::listener::open as open_connection;
