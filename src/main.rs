//! `outbox-relay`: the command line of the order service. The service itself
//! is the `outbox-relay` library (crates/outbox-relay); the demo and the bench
//! are `outbox-dev-tools`, behind the `dev-tools` feature.

mod cli;

// The subcommands are written against the service's modules by their short
// names, as they were when they lived inside it.
#[cfg(feature = "dev-tools")]
use outbox_dev_tools::{bench, demo};
use outbox_relay::{
    api, api_keys, at_rest, config, db, effects, endpoints, inbox, job_list, orders, otel, outbox,
    relay, sealed, server, shutdown, telemetry, text,
};

use std::process::ExitCode;

fn main() -> ExitCode {
    // Before anything connects: no OpenSSL cleanup at exit under a connect
    // still running on one of r2d2's threads.
    db::init_openssl();
    cli::main()
}
