//! The arguments of one kind of job ([`JobArgs`]): the type a job is enqueued
//! from and performed as, so its kind is written once.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::NewJob;

/// The arguments of one kind of job. The kind lives on the type, so a job is
/// enqueued and performed by the same definition and the name is written once.
///
/// ```
/// use outbox_core::worker::JobArgs;
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct ResizeImage {
///     image_id: i64,
///     width: u32,
/// }
///
/// impl JobArgs for ResizeImage {
///     const KIND: &'static str = "resize_image";
/// }
/// ```
pub trait JobArgs: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The job's `jobs.kind`: what worker pools claim by (`--kinds`) and what
    /// a `Workers` registry routes on. One worker per kind in a registry.
    const KIND: &'static str;

    /// Attaches to each job built from these arguments
    /// ([`NewJob::for_args`](NewJob::for_args), so every
    /// enqueue) what the application's
    /// [`InsertJobs`](super::InsertJobs) writes into its own columns
    /// of `jobs`, typed, with [`NewJob::with_extension`](NewJob::with_extension).
    /// The queue stores none of it. Default: nothing.
    fn extend_job(&self, job: NewJob) -> NewJob {
        job
    }
}
