//! `outbox-relay`: the command line of the order service. The service itself
//! is the `outbox-relay` library (crates/outbox-relay); the demo and the bench
//! are `outbox-dev-tools`, behind the `dev-tools` feature.

mod cli;

// The subcommands are written against the service's modules by their short
// names, as they were when they lived inside it.
#[cfg(feature = "dev-tools")]
use outbox_dev_tools::{bench, demo};
use outbox_relay::{
    api, api_keys, config, db, effects, endpoints, job_list, otel, outbox, relay, server, shutdown,
    telemetry, text,
};

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::main()
}
