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
                $($extra)*
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
