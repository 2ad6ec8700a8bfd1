//! A job to enqueue ([`NewJob`]) and its options ([`JobOptions`]).

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::DEFAULT_MAX_ATTEMPTS;
use super::args::JobArgs;
use super::depend::{DependencyPolicy, Parent};

/// A job to enqueue with [`Enqueuer::enqueue_many`](super::Enqueuer::enqueue_many):
/// typed with [`NewJob::for_args`], untyped with [`NewJob::new`]; its
/// options are [`JobOptions`], given with [`NewJob::with_options`]. Only an
/// [`Enqueuer`](super::Enqueuer) writes it: the row it becomes is private to
/// the queue, so no caller can insert past the enqueue's NOTIFY, ordering and
/// dependency checks.
#[derive(Debug, Clone)]
pub struct NewJob {
    /// Drawn ahead of the insert only when jobs of one enqueue name each
    /// other as parents; `None`: the column's default.
    pub(super) id: Option<i64>,
    pub(super) kind: String,
    pub(super) payload: serde_json::Value,
    pub(super) run_after: Option<DateTime<Utc>>,
    pub(super) max_attempts: i32,
    pub(super) ordering_key: Option<String>,
    /// Decided by the enqueue from the key's unfinished jobs, never by
    /// callers.
    pub(super) blocked: bool,
    pub(super) trace_context: Option<serde_json::Value>,
    pub(super) concurrency_key: Option<String>,
    /// Decided by the enqueue from the parents' statuses, never by callers
    /// (as `blocked`).
    pub(super) waiting_on: Vec<i64>,
    pub(super) depends_on: Option<Vec<i64>>,
    pub(super) dependency_policy: Option<String>,
    pub(super) unfinished_parents: Option<Vec<i64>>,
    /// Another job of the same enqueue waits for this one: decided by the
    /// enqueue, never by callers (as `blocked`).
    pub(super) has_dependents: bool,
    /// The parents as the options named them, resolved by the enqueue.
    pub(super) parents: Vec<Parent>,
    pub(super) policy: DependencyPolicy,
    /// No other job can have the key yet (see [`JobOptions::new_ordering_key`]).
    pub(super) key_is_new: bool,
    /// The application's typed values for its own columns.
    extensions: Extensions,
}

/// Values of distinct types, one per type, which the queue carries and never
/// reads.
#[derive(Clone, Default)]
struct Extensions(Vec<Arc<dyn Any + Send + Sync>>);

impl fmt::Debug for Extensions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Extensions({})", self.0.len())
    }
}

impl NewJob {
    /// A job carrying the trace context of the current span, if it has one
    /// (with `tracing-opentelemetry`'s layer installed): the worker pool's span for
    /// this job becomes its child, so a caller enqueueing in its own
    /// transaction gets one trace across the outbox without doing anything.
    pub fn new(kind: impl Into<String>, payload: serde_json::Value) -> Self {
        NewJob {
            id: None,
            kind: kind.into(),
            payload,
            run_after: None,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            ordering_key: None,
            blocked: false,
            trace_context: crate::trace_context::current(),
            concurrency_key: None,
            waiting_on: Vec::new(),
            depends_on: None,
            dependency_policy: None,
            unfinished_parents: None,
            has_dependents: false,
            parents: Vec::new(),
            policy: DependencyPolicy::Hold,
            key_is_new: false,
            extensions: Extensions::default(),
        }
    }
    /// Carries `value` to the [`InsertJobs`](super::InsertJobs) that writes
    /// the row (one value per type; a second replaces the first): how an
    /// application fills columns it added to `jobs` from the job's typed
    /// arguments rather than from its JSON (see
    /// [`JobArgs::extend_job`](crate::worker::JobArgs::extend_job)). The
    /// queue stores none of it.
    pub fn with_extension<T: Any + Send + Sync>(mut self, value: T) -> Self {
        // `is` on the value inside the Arc: the Arc itself is `Any` too.
        self.extensions.0.retain(|held| !(**held).is::<T>());
        self.extensions.0.push(Arc::new(value));
        self
    }
    /// The value of type `T` given to [`NewJob::with_extension`], if any.
    pub fn extension<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.extensions
            .0
            .iter()
            .find_map(|value| value.downcast_ref::<T>())
    }
    /// Another trace context than the current span's (`None`: no trace).
    pub fn trace_context(mut self, context: Option<serde_json::Value>) -> Self {
        self.trace_context = context;
        self
    }
    /// Applies `options`: the one place a job's options are set, for typed
    /// jobs ([`NewJob::for_args`]) and untyped ones alike. What `options`
    /// leaves unset keeps its default.
    pub fn with_options(mut self, options: &JobOptions) -> Self {
        if let Some(max_attempts) = options.max_attempts {
            // Below 1 is one attempt and no retry, never a job that cannot run.
            self.max_attempts = max_attempts.max(1);
        }
        if let Some(at) = options.run_after {
            self.run_after = Some(at);
        }
        if let Some(key) = &options.ordering_key {
            self.ordering_key = Some(key.clone());
            self.key_is_new = options.ordering_key_is_new;
        }
        if let Some(key) = &options.concurrency_key {
            self.concurrency_key = Some(key.clone());
        }
        self.parents.clone_from(&options.depends_on);
        self.policy = options.dependency_policy;
        self
    }
    /// The job's concurrency key, if it has one.
    pub fn concurrency_key_value(&self) -> Option<&str> {
        self.concurrency_key.as_deref()
    }
    /// The job's arguments, as stored in `jobs.payload`.
    pub fn payload(&self) -> &serde_json::Value {
        &self.payload
    }
    /// When the job falls due; `None`: at once (the column's default).
    pub fn run_after_value(&self) -> Option<DateTime<Utc>> {
        self.run_after
    }
    /// The job's ordering key, if it has one.
    pub fn ordering_key_value(&self) -> Option<&str> {
        self.ordering_key.as_deref()
    }
    /// Whether the job waits behind an earlier job of its key: decided by
    /// the enqueue before it calls an [`InsertJobs`](super::InsertJobs).
    pub fn is_blocked(&self) -> bool {
        self.blocked
    }
    /// The trace context stored with the job.
    pub fn trace_context_value(&self) -> Option<&serde_json::Value> {
        self.trace_context.as_ref()
    }
    /// The id drawn for the job ahead of the insert (jobs of one enqueue
    /// that name each other as parents); `None`: the column's default.
    pub fn id_value(&self) -> Option<i64> {
        self.id
    }
    /// The parents the job still waits for, as the enqueue decided them
    /// (`jobs.waiting_on`); empty when none.
    pub fn waiting_on_value(&self) -> &[i64] {
        &self.waiting_on
    }
    /// Every parent the job was enqueued with (`jobs.depends_on`).
    pub fn depends_on_value(&self) -> Option<&[i64]> {
        self.depends_on.as_deref()
    }
    /// `hold` or `run` for a job with parents (`jobs.dependency_policy`).
    pub fn dependency_policy_value(&self) -> Option<&str> {
        self.dependency_policy.as_deref()
    }
    /// Parents already failed that a `run` job goes without
    /// (`jobs.unfinished_parents`).
    pub fn unfinished_parents_value(&self) -> Option<&[i64]> {
        self.unfinished_parents.as_deref()
    }
    /// Whether another job of the same enqueue waits for this one
    /// (`jobs.has_dependents`; a dependent enqueued later marks it itself).
    pub fn has_dependents_value(&self) -> bool {
        self.has_dependents
    }
    /// The job's kind.
    pub fn kind(&self) -> &str {
        &self.kind
    }
    /// The `max_attempts` the job will be stored with.
    pub fn max_attempts_value(&self) -> i32 {
        self.max_attempts
    }
}

impl NewJob {
    /// The job for typed arguments: kind `A::KIND`, payload the arguments'
    /// JSON, `options` applied, and what [`JobArgs::extend_job`] attaches.
    /// Fails only when `args` does not serialize (a map with non-string
    /// keys, say).
    pub fn for_args<A: JobArgs>(args: &A, options: &JobOptions) -> serde_json::Result<Self> {
        let job = NewJob::new(A::KIND, serde_json::to_value(args)?).with_options(options);
        Ok(args.extend_job(job))
    }
}

/// How a typed job is enqueued; every option has a default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobOptions {
    /// How many claims the job gets before a retryable failure leaves it
    /// `failed` (default [`DEFAULT_MAX_ATTEMPTS`]); values below 1 are taken
    /// as 1, a single attempt and no retry.
    pub max_attempts: Option<i32>,
    /// Not before this time (default: due at once).
    pub run_after: Option<DateTime<Utc>>,
    /// Jobs with the same key run one at a time, in enqueue order, whichever
    /// worker pool claims them: a job waits while an earlier job of its key is
    /// pending, processing or failed. A failed job holds its key until it is
    /// retried (and succeeds) or cancelled.
    pub ordering_key: Option<String>,
    /// No other job can have [`JobOptions::ordering_key`] yet, so the enqueue
    /// skips the key's lock and head lookup (see
    /// [`JobOptions::new_ordering_key`]).
    pub ordering_key_is_new: bool,
    /// The job counts against this key's limits, set with
    /// [`set_concurrency_limit`](super::set_concurrency_limit): at most `max_in_flight` of
    /// the key's jobs processing, claims at most `per_second`, none while the
    /// key is paused. A key without limits is unlimited. Independent of the
    /// ordering key: a job may have both.
    pub concurrency_key: Option<String>,
    /// The jobs this one waits for (see [`JobOptions::depends_on`]).
    pub depends_on: Vec<Parent>,
    /// What a parent that does not finish `done` does to this job (default
    /// [`DependencyPolicy::Hold`]).
    pub dependency_policy: DependencyPolicy,
}

impl JobOptions {
    /// Sets [`JobOptions::max_attempts`].
    pub fn max_attempts(mut self, max_attempts: i32) -> Self {
        self.max_attempts = Some(max_attempts);
        self
    }
    /// Sets [`JobOptions::run_after`].
    pub fn run_after(mut self, at: DateTime<Utc>) -> Self {
        self.run_after = Some(at);
        self
    }
    /// Sets [`JobOptions::ordering_key`].
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self.ordering_key_is_new = false;
        self
    }
    /// Sets [`JobOptions::concurrency_key`]: the job counts against the
    /// key's [`ConcurrencyLimit`](super::ConcurrencyLimit).
    pub fn concurrency_key(mut self, key: impl Into<String>) -> Self {
        self.concurrency_key = Some(key.into());
        self
    }
    /// Sets an ordering key no other job can have: one named after a row the
    /// enqueuing transaction has just created (say `invoice-<id>-reminders`
    /// for an invoice it just inserted), which no other transaction can see
    /// before this one commits, so none can have enqueued under it. The
    /// first job of the key is claimable, later ones wait behind it, and the
    /// enqueue skips the key's lock and head lookup (two round trips). A key
    /// that does have older jobs would break ordered delivery: use
    /// [`JobOptions::ordering_key`] when in doubt.
    pub fn new_ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self.ordering_key_is_new = true;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An application's own column value, as its `InsertJobs` reads it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct InvoiceId(i64);

    #[derive(serde::Serialize, serde::Deserialize)]
    struct SendInvoice {
        invoice_id: i64,
    }

    impl JobArgs for SendInvoice {
        const KIND: &'static str = "send_invoice";

        fn extend_job(&self, job: NewJob) -> NewJob {
            job.with_extension(InvoiceId(self.invoice_id))
        }
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Plain {
        n: i64,
    }

    impl JobArgs for Plain {
        const KIND: &'static str = "plain";
    }

    #[test]
    fn typed_arguments_attach_their_extension_to_every_job_built_from_them() {
        let job = NewJob::for_args(&SendInvoice { invoice_id: 42 }, &JobOptions::default())
            .expect("serializes");
        assert_eq!(job.extension::<InvoiceId>(), Some(&InvoiceId(42)));
        assert_eq!(job.payload(), &serde_json::json!({ "invoice_id": 42 }));
        let cloned = job.clone();
        assert_eq!(cloned.extension::<InvoiceId>(), Some(&InvoiceId(42)));

        let plain = NewJob::for_args(&Plain { n: 1 }, &JobOptions::default()).expect("serializes");
        assert_eq!(plain.extension::<InvoiceId>(), None);
    }

    #[test]
    fn a_second_extension_of_a_type_replaces_the_first_and_others_stay() {
        let job = NewJob::new("k", serde_json::json!({}))
            .with_extension(InvoiceId(1))
            .with_extension("tenant-a")
            .with_extension(InvoiceId(2));
        assert_eq!(job.extension::<InvoiceId>(), Some(&InvoiceId(2)));
        assert_eq!(job.extension::<&str>(), Some(&"tenant-a"));
        assert_eq!(job.extension::<u8>(), None);
    }
}
