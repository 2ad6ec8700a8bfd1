//! `outbox-relay`: the command line of the order service. The service itself
//! is the `outbox-relay` library (crates/order-service); the demo and the bench
//! are `outbox-dev-tools`, behind the `dev-tools` feature.

mod cli;

// The subcommands are written against the service's modules by their short
// names, as they were when they lived inside it.
use order_service::{
    api, api_keys, at_rest, config, db, effects, endpoints, inbox, job_list, orders, otel, outbox,
    sealed, server, shutdown, telemetry, text, worker_pool,
};
#[cfg(feature = "dev-tools")]
use outbox_dev_tools::{bench, demo};

use std::process::ExitCode;

/// Every allocation of the relay, the API and the CLI: the relay allocates
/// and frees per job (a task, its context, its body, its outcome), and glibc
/// spent more of the relay's CPU on that than any function of ours.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Before anything connects: no OpenSSL cleanup at exit under a connect
    // still running on one of r2d2's threads.
    db::init_openssl();
    cli::main()
}
