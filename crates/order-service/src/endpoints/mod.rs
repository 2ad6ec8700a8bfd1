//! Subscribers as data: the endpoints order events are delivered to, each
//! with its own URL, signing secret, event types, throttle and breaker state.
//!
//! [`spec`] parses what an operator says about an endpoint (every error names
//! its flag), [`nats`] what a NATS endpoint adds, [`nats_credentials`] its
//! own credentials (stored, never shown back); [`store`] keeps the
//! `endpoints` table; [`target`] is what a delivery reads of its endpoint, and
//! keeps `default` from `WEBHOOK_URL`.

pub mod attempts;
pub mod breaker;
pub mod nats;
pub mod nats_credentials;
pub mod notice;
pub mod recover;
pub mod spec;
pub mod store;
pub mod target;
pub mod throttle;
pub mod upkeep;

pub use crate::orders::EndpointId;
pub use nats::{NatsTarget, StreamName, SubjectPrefix};
pub use nats_credentials::EndpointCredentials;
pub use spec::{
    DEFAULT_MAX_IN_FLIGHT, EVENT_ENDPOINT_DISABLED, EndpointName, EndpointUrl, EventTypes,
    RateLimit, SigningSecret, SpecError,
};
pub use store::{Endpoint, NewEndpoint, Removed, StoreError};
pub use target::{DEFAULT_ENDPOINT, Target};
