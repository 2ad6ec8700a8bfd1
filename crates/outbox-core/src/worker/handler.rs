//! The untyped interface a worker pool calls: one claimed job in, a result out.

use std::future::Future;
use std::pin::Pin;

use super::{EffectResult, JobContext};
use crate::statements::ClaimedJob;

/// A boxed, sendable future: what an [`JobHandler`] returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Runs one claimed job, untyped: the interface the worker pool calls.
/// [`Workers`](super::Workers) implements it; implement it directly only
/// when a job's raw row is needed. Implementations must not panic on bad
/// input: a payload that does not decode is
/// [`EffectError::Permanent`](super::EffectError::Permanent).
pub trait JobHandler: Send + Sync + 'static {
    /// Performs one attempt of `job`.
    fn execute<'a>(&'a self, job: &'a ClaimedJob, ctx: JobContext) -> BoxFuture<'a, EffectResult>;

    /// Told of the jobs one claim took, as the claim returns and before any
    /// of them starts. A handler whose jobs read rows before their effect
    /// can start one read for the whole claim here, instead of one per job
    /// as each starts. It must not block (spawn what takes time), and it
    /// must not rely on being told: a job may start without it. The default
    /// does nothing.
    fn claimed(&self, jobs: &[&ClaimedJob]) {
        let _ = jobs;
    }
}
