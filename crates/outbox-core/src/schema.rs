//! Diesel table definitions for the queue's tables (`migrations/` of this crate).
//!
//! An application may add columns of its own to `jobs` and `jobs_done`;
//! these definitions name only the queue's columns, which is all the queue
//! reads and writes.

diesel::table! {
    jobs (id) {
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
    }
}

diesel::table! {
    /// Every job wherever it lives: `jobs` (pending, processing, failed,
    /// cancelled) and `jobs_done` (the archive). A view: read it, never write it.
    jobs_all (id) {
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
    }
}

diesel::allow_tables_to_appear_in_same_query!(jobs, jobs_all);
