//! Logs every publish in `delivery_attempts`, as webhook calls are logged,
//! in the transaction that records the publish's outcome.
//!
//! Why there: a transaction of its own per publish, or per batch of
//! publishes ending together, was most of what a publish job cost the
//! database beside its no-op twin; riding with the outcome it costs none.
//! The core writes the rows of a whole batch of outcomes in one statement
//! (`record_attempts.sql`), after the fenced finish, and only for the claims
//! it matched: an operator who sees a job done (or retried, or failed) sees
//! its attempt, and a zombie whose lease was lost logs nothing, as it
//! records nothing else. The worker hands its attempt over with
//! `JobContext::write_with_outcome`, whatever the outcome, since failed
//! publishes are logged too.

use diesel::prelude::*;
use diesel::sql_types::Jsonb;

use crate::endpoints::attempts::{EXCERPT_CHARS, NewAttempt};
use crate::outbox::{CommitHook, HookRow, LocalWrite};

/// The write that logs `attempt` with its job's outcome.
pub fn log_attempt(attempt: &NewAttempt) -> LocalWrite {
    LocalWrite::new(AttemptRow {
        job_id: attempt.job_id,
        row: row(attempt),
    })
}

/// `attempt` as a row of `record_attempts.sql`: an array in its column
/// order, not an object, since a row is built, copied and parsed for every
/// publish, and its names would be most of it.
fn row(attempt: &NewAttempt) -> serde_json::Value {
    serde_json::json!([
        attempt.job_id,
        attempt.endpoint_id.get(),
        attempt.attempt,
        attempt.started_at.timestamp_micros(),
        i32::try_from(attempt.duration.as_millis()).unwrap_or(i32::MAX),
        attempt.status_code,
        attempt.outcome,
        attempt
            .excerpt
            .as_deref()
            .map(|e| crate::text::one_line(e, EXCERPT_CHARS)),
        attempt.stream_sequence,
    ])
}

struct AttemptRow {
    job_id: i64,
    row: serde_json::Value,
}

/// Inserts a batch of attempt rows (`$1`, a JSON array of them, each an
/// array in the statement's column order); the bench replays it to measure
/// what the attempt log costs.
pub const RECORD_ATTEMPTS_SQL: &str = include_str!("record_attempts.sql");

impl CommitHook for AttemptRow {
    fn apply(&self, conn: &mut PgConnection) -> QueryResult<()> {
        diesel::sql_query(RECORD_ATTEMPTS_SQL)
            .bind::<Jsonb, _>(serde_json::Value::Array(vec![self.row.clone()]))
            .execute(conn)
            .map(drop)
    }

    fn row(&self) -> Option<HookRow> {
        Some(HookRow {
            statement: RECORD_ATTEMPTS_SQL,
            row: self.row.clone(),
        })
    }

    fn describe(&self) -> String {
        format!("the publish attempt of job {}", self.job_id)
    }
}
