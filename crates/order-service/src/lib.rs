//! outbox-relay: a transactional outbox for order workflows on PostgreSQL.
//!
//! An order service writes an order and the jobs that must follow it in one
//! transaction ([`orders::place_order`]). The queue itself is the
//! [`outbox_core`] crate, which knows nothing of orders: this crate defines the
//! order jobs ([`orders::jobs`]) and their workers ([`effects::workers()`]) with
//! its typed API, as any library user would, and adds the order API, the
//! operator dashboard and the CLI. ARCHITECTURE.md, at the root of the
//! repository, follows one order through the files.
//!
//! # Layout
//!
//! - [`orders`]: `NewOrder` and its newtypes, parsed at the edge; `place_order`
//!   and the order's transitions, each with its jobs (`ConfirmationEmail`,
//!   `OrderEmail`, `ReceiptPdf`, `OrderWebhook`, `OrderPublish`) in one
//!   transaction; reading an order back. It does not depend on `effects`.
//! - [`effects`]: the kinds a relay performs, their workers (which read orders
//!   through `orders`), and what each effect does (email, receipt PDF, signed
//!   webhook, NATS publish).
//! - [`endpoints`]: the subscribers order events go to (`endpoints` table):
//!   their URLs, secrets, event types and limits, checked at the edge.
//! - [`inbox`]: payments in: the sources that send signed webhooks, their
//!   signatures, and each message applied to its order once, on the core's
//!   inbox.
//! - [`api_keys`]: API keys (`ork_…`): their scopes, their stored hash,
//!   creating, listing, revoking and authenticating them.
//! - [`api`]: the order HTTP API (axum): `/orders`, their keys, scopes and
//!   per-key limit ([`api::api_key_limit`]).
//! - [`admin`]: the operator dashboard under `/admin`, an application of its
//!   own beside the API (templates in `templates/admin/`, its SQL in `admin/sql/`).
//! - [`server`]: the public listener that mounts the API and the dashboard.
//! - [`sealed`]: secrets sealed at rest (`SECRETS_KEY`): the signing secrets
//!   and NATS credentials of endpoints and sources, sealed where they are
//!   written and opened where they are used; [`at_rest`] counts them at
//!   start and seals them all (`secrets seal`).
//! - [`links`]: the signed, expiring receipt links written into emails.
//! - [`job_list`]: the operator's list of jobs (`jobs list`, the jobs page) and its filter.
//! - [`config`]: typed settings from flags and the environment, validated at
//!   start; the dashboard's settings in [`config::dashboard`]. A leaf: it
//!   imports none of the parts above, which each read their settings from it.
//! - [`kinds`]: [`kinds::EffectKind`], the kinds' names, written once;
//!   [`client_addr`]: who a request comes from (`TRUSTED_PROXIES`). Leaves the
//!   configuration shares with the parts.
//! - [`db`]: the core's pool and helpers, and this service's migrations.
//! - [`schema`]: the Diesel tables of the service, and its view of `jobs` with `order_id`.
//! - [`http_server`]: the accept loop of every listener: header and write
//!   timeouts, the connection cap (evicting the longest-idle connection),
//!   keep-alive limits, graceful shutdown.
//! - [`telemetry`]: tracing subscriber, Prometheus metrics, `/healthz`.
//! - [`otel`]: the OpenTelemetry tracer and its OTLP/HTTP export.
//! - [`trace_context`]: W3C trace context from a request's headers into the
//!   enqueuing span (the core stores it with each job) and out to the effect's.
//! - [`text`]: outside text shortened to one line for display.
//! - [`shutdown`]: SIGTERM / SIGINT as a cancellation token.
//! - The `outbox-relay` command line is the binary at the repository's root
//!   (`src/cli/`); the demo and the bench are the `outbox-dev-tools` crate.
//! - Re-exported from the core: [`outbox`] (the jobs table), [`worker_pool`] (the
//!   worker pool), [`worker`] (typed jobs and workers).

pub mod admin;
pub mod api;
pub mod api_keys;
pub mod at_rest;
pub mod client_addr;
pub mod config;
pub mod db;
pub mod effects;
pub mod endpoints;
pub mod http_server;
pub mod inbox;
pub mod job_list;
pub mod kinds;
pub mod links;
pub mod orders;
pub mod otel;
pub mod schema;
pub mod sealed;
pub mod server;
pub mod shutdown;
pub mod signature;
pub mod telemetry;
pub mod text;
pub mod trace_context;

/// The queue core this service is built on, whole.
pub use outbox_core;
pub use outbox_core::{outbox, worker, worker_pool};
