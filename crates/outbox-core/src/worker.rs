//! Performing jobs: typed workers, the registry that routes a claimed job to
//! its worker, and the error classes that decide retry or `failed`.
//!
//! A job type implements [`JobArgs`] (its kind and its serde arguments); a
//! [`Worker`] for it receives the decoded arguments and a [`JobContext`].
//! [`Workers`] holds one worker per kind and is what a [`WorkerPool`] runs: it
//! decodes each claimed job into its type, and turns an unknown kind or
//! arguments that do not decode into a permanent failure with a clear
//! `last_error`, never a panic.
//!
//! [`JobHandler`] is the untyped interface
//! underneath, for callers that need the raw row (a benchmark's recorder, a
//! test's scripted effect).
//!
//! [`WorkerPool`]: crate::worker_pool::WorkerPool

mod context;
mod error;
pub(crate) mod handler;

use std::collections::BTreeMap;
use std::future::Future;
use std::marker::PhantomData;

pub use context::JobContext;
pub use error::EffectError;
pub use handler::{BoxFuture, JobHandler};

/// Where jobs live (`outbox`); here too, since a worker is written for it.
pub use crate::outbox::JobArgs;

use crate::outbox::LocalWrite;
use crate::statements::ClaimedJob;

/// Success, possibly with a write to commit atomically with the job's
/// completion (see [`LocalWrite`]).
pub type EffectResult = Result<Option<LocalWrite>, EffectError>;

/// Performs jobs of one type. Write it as an `async fn`:
///
/// ```
/// use outbox_core::worker::{EffectError, EffectResult, JobArgs, JobContext, Worker};
///
/// # #[derive(serde::Serialize, serde::Deserialize)]
/// # struct ResizeImage { image_id: i64, width: u32 }
/// # impl JobArgs for ResizeImage { const KIND: &'static str = "resize_image"; }
/// struct Resizer;
///
/// impl Worker<ResizeImage> for Resizer {
///     async fn work(&self, args: ResizeImage, ctx: JobContext) -> EffectResult {
///         if args.width == 0 {
///             return Err(EffectError::permanent("width must be positive"));
///         }
///         tracing::info!(attempt = ctx.attempt(), image = args.image_id, "resizing");
///         Ok(None)
///     }
/// }
/// ```
///
/// Return [`EffectError::Retryable`] for failures worth another attempt (the
/// worker pool backs off and retries until the job's `max_attempts`), and
/// [`EffectError::Permanent`] when retrying cannot help. A worker that runs
/// long should watch [`JobContext::cancelled`]: the worker pool drops the future
/// when the job's lease is lost, its deadline passes or the worker pool stops, and
/// the signal lets it stop cleanly first. A panic is caught and retried.
pub trait Worker<A: JobArgs>: Send + Sync + 'static {
    /// Performs one attempt of one job.
    fn work(&self, args: A, ctx: JobContext) -> impl Future<Output = EffectResult> + Send;

    /// Told of this kind's jobs among those one claim took, before any of
    /// them starts: see [`JobHandler::claimed`]. The default does nothing.
    fn claimed(&self, jobs: &[&ClaimedJob]) {
        let _ = jobs;
    }
}

/// One worker per kind; the [`JobHandler`] a worker pool runs.
///
/// ```
/// # use outbox_core::worker::{EffectResult, JobArgs, JobContext, Worker, Workers};
/// # #[derive(serde::Serialize, serde::Deserialize)]
/// # struct ResizeImage { image_id: i64 }
/// # impl JobArgs for ResizeImage { const KIND: &'static str = "resize_image"; }
/// # struct Resizer;
/// # impl Worker<ResizeImage> for Resizer {
/// #     async fn work(&self, _: ResizeImage, _: JobContext) -> EffectResult { Ok(None) }
/// # }
/// let workers = Workers::new().register::<ResizeImage, _>(Resizer);
/// assert_eq!(workers.kinds(), ["resize_image"]);
/// ```
#[derive(Default)]
pub struct Workers {
    by_kind: BTreeMap<&'static str, Box<dyn ErasedWorker>>,
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers")
            .field("kinds", &self.kinds())
            .finish()
    }
}

impl Workers {
    /// An empty registry.
    pub fn new() -> Self {
        Workers::default()
    }

    /// Adds `worker` for the jobs of kind `A::KIND`, replacing any worker
    /// registered for that kind before.
    pub fn register<A: JobArgs, W: Worker<A>>(mut self, worker: W) -> Self {
        self.by_kind.insert(
            A::KIND,
            Box::new(Typed {
                worker,
                args: PhantomData::<fn() -> A>,
            }),
        );
        self
    }

    /// The kinds with a worker, sorted: what a worker pool running this registry
    /// should claim.
    pub fn kinds(&self) -> Vec<&'static str> {
        self.by_kind.keys().copied().collect()
    }
}

impl JobHandler for Workers {
    fn claimed(&self, jobs: &[&ClaimedJob]) {
        let mut by_kind: BTreeMap<&str, Vec<&ClaimedJob>> = BTreeMap::new();
        for job in jobs {
            by_kind.entry(job.kind.as_str()).or_default().push(job);
        }
        for (kind, jobs) in by_kind {
            if let Some(worker) = self.by_kind.get(kind) {
                worker.claimed(&jobs);
            }
        }
    }

    fn execute<'a>(&'a self, job: &'a ClaimedJob, ctx: JobContext) -> BoxFuture<'a, EffectResult> {
        match self.by_kind.get(job.kind.as_str()) {
            Some(worker) => worker.run(job, ctx),
            None => {
                let known = self.kinds().join(", ");
                Box::pin(std::future::ready(Err(EffectError::permanent(format!(
                    "unknown job kind {:?}: no worker is registered for it (this relay's workers: {known})",
                    job.kind
                )))))
            }
        }
    }
}

/// Decodes a job's payload into its arguments. The error names the path of
/// the field that did not decode (`items[0].quantity: invalid type ...`) and
/// quotes the payload, since that is what an operator needs to fix it.
fn decode_args<A: JobArgs>(payload: &serde_json::Value) -> Result<A, EffectError> {
    serde_path_to_error::deserialize::<_, A>(payload).map_err(|e| {
        let at = e.path().to_string();
        let at = if at == "." {
            String::new()
        } else {
            format!(" at {at}")
        };
        EffectError::permanent(format!(
            "{} payload does not decode{at}: {}: {payload}",
            A::KIND,
            e.inner()
        ))
    })
}

/// A [`Worker`] with its argument type erased, as the registry keeps it.
trait ErasedWorker: Send + Sync + 'static {
    fn run<'a>(&'a self, job: &'a ClaimedJob, ctx: JobContext) -> BoxFuture<'a, EffectResult>;
    fn claimed(&self, jobs: &[&ClaimedJob]);
}

struct Typed<A, W> {
    worker: W,
    args: PhantomData<fn() -> A>,
}

impl<A: JobArgs, W: Worker<A>> ErasedWorker for Typed<A, W> {
    fn run<'a>(&'a self, job: &'a ClaimedJob, ctx: JobContext) -> BoxFuture<'a, EffectResult> {
        match decode_args::<A>(&job.payload) {
            Ok(args) => Box::pin(self.worker.work(args, ctx)),
            Err(error) => Box::pin(std::future::ready(Err(error))),
        }
    }

    fn claimed(&self, jobs: &[&ClaimedJob]) {
        self.worker.claimed(jobs);
    }
}
