//! Development tooling for outbox-relay, kept out of the product crate: the
//! binary offers it as `outbox-relay demo` and `outbox-relay bench` (the
//! `dev-tools` feature), and the integration tests start their servers and
//! sinks with it.
//!
//! - [`demo`]: the whole system end to end with nothing to set up: a private
//!   PostgreSQL, the order API, a relay, and the local SMTP and webhook sinks
//!   it and the tests use.
//! - [`bench`](mod@bench): drain throughput against the raw-SQL ceiling, enqueue-to-start
//!   latency, the API's order rate, and the relay's costs per job.
//! - [`private_pg`]: a throwaway PostgreSQL server from the machine's own
//!   server programs.
//! - [`scratch`]: a throwaway database on a running server.

pub mod bench;
pub mod demo;
pub mod private_pg;
pub mod scratch;
