//! `outbox-relay demo` and the local sinks it runs.

pub mod sinks;
