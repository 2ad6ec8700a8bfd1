//! The one integration test binary. Each test gets its own database cloned
//! from a migrated template (see `support::db`), so tests run in parallel.

mod support;

mod admin;
mod admin_dependencies;
mod admin_endpoints;
mod admin_sessions;
mod api;
mod api_keys;
mod architecture;
mod bench;
mod breaker;
mod cli_config;
mod cli_jobs;
mod demo;
mod effects_email;
mod effects_receipt;
mod effects_webhook;
mod endpoint_delivery;
mod endpoint_fairness;
mod endpoints;
mod faults;
mod front_door;
mod front_door_auth;
mod inbox;
mod inbox_refunds;
mod inbox_refusals;
mod inbox_retention;
mod metrics;
mod nats;
mod nats_attempts;
mod orders;
mod outbox;
mod queue_core;
mod receipt_links;
mod relay;
mod retention;
mod schema_catalog;
mod secret_files;
mod secrets_at_rest;
mod secrets_plaintext;
mod subscribers;
mod timed;
mod trace;
mod upkeep;
mod workflow;
