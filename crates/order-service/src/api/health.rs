//! `GET /healthz` without a database round trip per call: a background check
//! (`SELECT 1` every [`HEALTH_CHECK_INTERVAL`]) and the outcome of every
//! request's own database work are written here, and `/healthz` reads the
//! latest. So a flood of probes costs no connection, and an outage shows at
//! once, from whichever of the two meets it first.

use std::sync::Mutex;
use std::time::Duration;

use axum::Json;
use axum::http::StatusCode;
use serde_json::Value;

use crate::telemetry::health_answer;

/// How often the background check runs.
pub const HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How long one check may take before it counts as a failure.
pub(super) const CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// The latest word on the database.
#[derive(Debug, Default)]
pub(crate) struct Health {
    /// `None` until the first check or request; then `Ok` or the error body.
    latest: Mutex<Option<Result<(), Value>>>,
}

impl Health {
    fn set(&self, outcome: Result<(), Value>) {
        *self.latest.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
    }

    pub fn up(&self) {
        self.set(Ok(()));
    }

    pub fn down(&self, error: Value) {
        self.set(Err(error));
    }

    /// The answer of `/healthz`.
    pub fn answer(&self) -> (StatusCode, Json<Value>) {
        let latest = self
            .latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        health_answer(match latest {
            Some(Ok(())) => None,
            Some(Err(error)) => Some(error),
            None => Some(serde_json::json!({
                "code": "database_unavailable",
                "message": "the database was not checked yet",
            })),
        })
    }
}
