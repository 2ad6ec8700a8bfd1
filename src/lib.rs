//! outbox-relay: a transactional outbox for order workflows on PostgreSQL.
//!
//! An order service writes an order and the jobs that must follow it in one
//! transaction ([`orders::place_order`], or [`outbox::enqueue`] inside any
//! caller's Diesel transaction). A relay ([`relay::Relay`]) claims due jobs with
//! `FOR UPDATE SKIP LOCKED`, performs their effects ([`effects`]) and records the
//! outcome with a fenced update, so a worker that lost its lease changes nothing.
//!
//! # Layout
//!
//! - [`config`]: typed settings from flags and the environment, validated at start.
//! - [`db`]: the r2d2 pool, embedded migrations, running Diesel off the async threads.
//! - [`orders`]: `NewOrder` and its newtypes, parsed at the edge; `place_order`.
//! - [`outbox`]: the jobs table: enqueue, claim, finish (fenced), heartbeat, reap, admin,
//!   cancel.
//!   Queue SQL lives in `src/outbox/sql/`, one statement a file.
//! - [`relay`]: the worker pool: producer, executors, completer, heartbeat, reaper,
//!   LISTEN/NOTIFY wake-ups, graceful shutdown, and the retry policy.
//! - [`effects`]: the typed effects behind one interface and their error classes.
//! - [`api`]: the order HTTP API (axum), and the operator dashboard under `/admin`
//!   (`api::admin`: templates in `templates/admin/`, its SQL in `src/api/admin/sql/`).
//! - [`http_server`]: the accept loop of every listener: header timeout,
//!   connection cap, keep-alive limits, graceful shutdown.
//! - [`telemetry`]: tracing subscriber and Prometheus metrics.
//! - [`otel`]: the OpenTelemetry tracer and its OTLP/HTTP export.
//! - [`trace_context`]: W3C trace context from a request, through `jobs.trace_context`,
//!   to the relay's span and the effect's headers.
//! - [`demo`]: `outbox-relay demo`, the whole system end to end with nothing to
//!   set up, and the local SMTP and webhook sinks it (and the tests) use.
//! - [`cli`]: the `outbox-relay` subcommands.

pub mod api;
pub mod bench;
pub mod cli;
pub mod config;
pub mod db;
pub mod demo;
pub mod effects;
pub mod http_server;
pub mod job_list;
pub mod orders;
pub mod otel;
pub mod private_pg;
pub mod schema;
pub mod scratch;
pub mod telemetry;
pub mod trace_context;

/// The queue core this service is built on, whole.
pub use outbox_core;
pub use outbox_core::{outbox, relay, shutdown, worker};
