//! Diesel table definitions for the service's tables (`migrations/`), and
//! the service's view of `jobs` and `jobs_all`: the core's columns plus
//! `order_id`, which only this service has and reads.

diesel::table! {
    orders (id) {
        id -> Int8,
        customer_email -> Text,
        customer_name -> Text,
        currency -> Bpchar,
        total_cents -> Int8,
        idempotency_key -> Nullable<Text>,
        request_hash -> Nullable<Text>,
        created_at -> Timestamptz,
        status -> Text,
        api_key_id -> Nullable<Int8>,
        expires_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    order_events (id) {
        id -> Int8,
        order_id -> Int8,
        seq -> Int4,
        #[sql_name = "type"]
        event_type -> Text,
        data -> Jsonb,
        idempotency_key -> Nullable<Text>,
        request_hash -> Nullable<Text>,
        created_at -> Timestamptz,
        api_key_id -> Nullable<Int8>,
        inbox_message_id -> Nullable<Int8>,
        fanned_out -> Int4,
    }
}

diesel::table! {
    order_items (id) {
        id -> Int8,
        order_id -> Int8,
        sku -> Text,
        name -> Text,
        quantity -> Int4,
        unit_price_cents -> Int8,
    }
}

// The queue's columns come from the core; the service adds `order_id`.
outbox_core::jobs_table! {
    jobs {
        order_id -> Nullable<Int8>,
    }
}

outbox_core::jobs_table! {
    /// Every job wherever it lives: `jobs` (pending, processing, failed,
    /// cancelled) and `jobs_done` (the archive). A view: read it, never write it.
    jobs_all {
        order_id -> Nullable<Int8>,
    }
}

diesel::table! {
    receipts (order_id) {
        order_id -> Int8,
        pdf -> Bytea,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    endpoints (id) {
        id -> Int8,
        name -> Text,
        url -> Text,
        event_types -> Nullable<Array<Text>>,
        enabled -> Bool,
        disabled_reason -> Nullable<Text>,
        rate_limit -> Nullable<Float8>,
        max_in_flight -> Int4,
        secret -> Text,
        previous_secret -> Nullable<Text>,
        previous_secret_expires_at -> Nullable<Timestamptz>,
        allow_http -> Bool,
        failing_since -> Nullable<Timestamptz>,
        stream -> Nullable<Text>,
        subject_prefix -> Nullable<Text>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        nats_credentials -> Nullable<Text>,
    }
}

diesel::table! {
    /// API keys: only the SHA-256 of each secret is stored.
    api_keys (id) {
        id -> Int8,
        name -> Text,
        scopes -> Array<Text>,
        secret_sha256 -> Bytea,
        created_at -> Timestamptz,
        expires_at -> Nullable<Timestamptz>,
        last_used_at -> Nullable<Timestamptz>,
        revoked_at -> Nullable<Timestamptz>,
    }
}

diesel::joinable!(order_items -> orders (order_id));
diesel::joinable!(jobs -> orders (order_id));
diesel::joinable!(jobs_all -> orders (order_id));
diesel::joinable!(receipts -> orders (order_id));
diesel::joinable!(order_events -> orders (order_id));

diesel::allow_tables_to_appear_in_same_query!(
    orders,
    order_items,
    order_events,
    jobs,
    jobs_all,
    receipts,
    endpoints,
    api_keys
);

diesel::table! {
    delivery_attempts (id) {
        id -> Int8,
        job_id -> Int8,
        endpoint_id -> Int8,
        attempt -> Int4,
        started_at -> Timestamptz,
        duration_ms -> Int4,
        status_code -> Nullable<Int2>,
        outcome -> Text,
        excerpt -> Nullable<Text>,
        stream_sequence -> Nullable<Int8>,
    }
}

diesel::table! {
    /// Senders of inbound events (`POST /inbound/{name}`).
    sources (id) {
        id -> Int8,
        name -> Text,
        kind -> Text,
        secret -> Text,
        previous_secret -> Nullable<Text>,
        previous_secret_expires_at -> Nullable<Timestamptz>,
        created_at -> Timestamptz,
        mode -> Text,
        api_key -> Nullable<Text>,
    }
}

diesel::table! {
    /// Where each source's reconciliation got to, and its last run.
    source_reconciliations (source_id) {
        source_id -> Int8,
        started_at -> Nullable<Timestamptz>,
        finished_at -> Nullable<Timestamptz>,
        watermark -> Nullable<Timestamptz>,
        fetched -> Int4,
        recovered -> Int4,
        already -> Int4,
        pages -> Int4,
        last_error -> Nullable<Text>,
        last_error_at -> Nullable<Timestamptz>,
    }
}

diesel::joinable!(source_reconciliations -> sources (source_id));
diesel::allow_tables_to_appear_in_same_query!(sources, source_reconciliations);

diesel::table! {
    /// The core's inbox table with the service's columns.
    inbox_messages (id) {
        id -> Int8,
        source -> Text,
        message_id -> Text,
        received_at -> Timestamptz,
        #[sql_name = "type"]
        message_type -> Nullable<Text>,
        order_id -> Nullable<Int8>,
        status -> Nullable<Text>,
        reason -> Nullable<Text>,
        payload -> Nullable<Jsonb>,
        decided_at -> Nullable<Timestamptz>,
        via -> Text,
    }
}

diesel::allow_tables_to_appear_in_same_query!(inbox_messages, orders);
