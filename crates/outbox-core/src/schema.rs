//! Diesel table definitions for the queue's tables (`migrations/` of this crate).
//!
//! An application may add columns of its own to `jobs` and `jobs_done`;
//! these definitions name only the queue's columns, which is all the queue
//! reads and writes. An application that reads its own columns defines its
//! view of the tables with [`jobs_table!`](crate::jobs_table), which writes
//! the queue's columns for it, so they are listed once.

/// A Diesel `table!` of the queue's jobs columns plus the caller's own, after
/// them: `outbox_core::jobs_table! { jobs { tenant_id -> Nullable<Int8>, } }`.
/// The caller needs `diesel` in scope, as `table!` does. Doc comments and
/// attributes before the name go on the table.
#[macro_export]
macro_rules! jobs_table {
    ($(#[$meta:meta])* $name:ident { $($extra:tt)* }) => {
        diesel::table! {
            $(#[$meta])*
            $name (id) {
            id -> Int8,
            kind -> Text,
            payload -> Jsonb,
            status -> Text,
            run_after -> Timestamptz,
            attempts -> Int4,
            max_attempts -> Int4,
            locked_by -> Nullable<Text>,
            locked_at -> Nullable<Timestamptz>,
            lease_expires_at -> Nullable<Timestamptz>,
            created_at -> Timestamptz,
            finished_at -> Nullable<Timestamptz>,
            last_error -> Nullable<Text>,
            lease_token -> Nullable<Int8>,
            ordering_key -> Nullable<Text>,
            blocked -> Bool,
            trace_context -> Nullable<Jsonb>,
            concurrency_key -> Nullable<Text>,
            waiting_on -> Array<Int8>,
            depends_on -> Nullable<Array<Int8>>,
            dependency_policy -> Nullable<Text>,
            unfinished_parents -> Nullable<Array<Int8>>,
            has_dependents -> Nullable<Bool>,
                $($extra)*
            }
        }
    };
}

/// An `Insertable` of the queue's columns of a [`NewJob`](crate::outbox::NewJob)
/// into `$table`, a table of [`jobs_table!`](crate::jobs_table), made from
/// the job with `From<&NewJob>`: the one list of the columns an enqueue
/// writes. The queue's own insert writes it into `jobs`; an application that
/// added columns defines it for its own `jobs` table and embeds it in a row
/// of its own beside its columns, for its
/// [`InsertJobs`](crate::outbox::InsertJobs):
///
/// ```ignore
/// outbox_core::queue_row!(QueueRow for crate::schema::jobs);
///
/// #[derive(diesel::Insertable)]
/// #[diesel(table_name = crate::schema::jobs)]
/// struct TenantJobRow<'a> {
///     #[diesel(embed)]
///     queue: QueueRow<'a>,
///     tenant_id: Option<i64>,
/// }
/// ```
///
/// The caller needs `diesel` in scope, as `table!` does.
#[macro_export]
macro_rules! queue_row {
    ($vis:vis $name:ident for $($table:tt)+) => {
        #[derive(diesel::Insertable)]
        #[diesel(table_name = $($table)+)]
        $vis struct $name<'a> {
            id: Option<i64>,
            kind: &'a str,
            payload: &'a $crate::__private::serde_json::Value,
            run_after: Option<$crate::__private::chrono::DateTime<$crate::__private::chrono::Utc>>,
            max_attempts: i32,
            ordering_key: Option<&'a str>,
            blocked: bool,
            trace_context: Option<&'a $crate::__private::serde_json::Value>,
            concurrency_key: Option<&'a str>,
            waiting_on: &'a [i64],
            depends_on: Option<&'a [i64]>,
            dependency_policy: Option<&'a str>,
            unfinished_parents: Option<&'a [i64]>,
            has_dependents: bool,
        }

        impl $name<'_> {
            /// Which optional columns this row writes, one bit each: rows
            /// of the same shapes make the same insert text.
            #[allow(dead_code)]
            $vis fn shape(&self) -> u32 {
                [
                    self.id.is_some(),
                    self.run_after.is_some(),
                    self.ordering_key.is_some(),
                    self.trace_context.is_some(),
                    self.concurrency_key.is_some(),
                    self.depends_on.is_some(),
                    self.dependency_policy.is_some(),
                    self.unfinished_parents.is_some(),
                ]
                .into_iter()
                .fold(0, |mask, written| (mask << 1) | u32::from(written))
            }
        }

        impl<'a> From<&'a $crate::outbox::NewJob> for $name<'a> {
            fn from(job: &'a $crate::outbox::NewJob) -> Self {
                $name {
                    id: job.id_value(),
                    kind: job.kind(),
                    payload: job.payload(),
                    run_after: job.run_after_value(),
                    max_attempts: job.max_attempts_value(),
                    ordering_key: job.ordering_key_value(),
                    blocked: job.is_blocked(),
                    trace_context: job.trace_context_value(),
                    concurrency_key: job.concurrency_key_value(),
                    waiting_on: job.waiting_on_value(),
                    depends_on: job.depends_on_value(),
                    dependency_policy: job.dependency_policy_value(),
                    unfinished_parents: job.unfinished_parents_value(),
                    has_dependents: job.has_dependents_value(),
                }
            }
        }
    };
}

crate::jobs_table! { jobs {} }

crate::jobs_table! {
    /// Every job wherever it lives: `jobs` (pending, processing, failed,
    /// cancelled) and `jobs_done` (the archive). A view: read it, never write it.
    jobs_all {}
}

diesel::allow_tables_to_appear_in_same_query!(jobs, jobs_all);
