//! Logs every publish in `delivery_attempts`, as webhook calls are logged,
//! without a round trip per publish.
//!
//! Why not with the job's completion: the core's finish statement knows
//! nothing of the service's tables, and the only way to write beside it, a
//! `LocalWrite`, exists only for a done job (a failed publish must be logged
//! too), runs once per job, and moves the whole batch of outcomes off the
//! relay's prepared statement onto a Diesel transaction. Nor as the webhook
//! worker does, one statement per call on a pooled connection: publishes are
//! ten times cheaper than calls, and a round trip each would cost more than
//! the publish and its PubAck.
//!
//! So each publish hands its attempt to one log task and awaits the answer,
//! as [`loader`](super::loader) does for reads (both are a
//! `MicroBatcher`): the task writes every attempt waiting at that moment in
//! one statement; attempts arriving meanwhile form the next batch. The job
//! finishes after its attempt is written, so an operator who sees it done
//! sees its attempt. A write that fails is logged, never the job's failure:
//! the publish happened either way.

use super::micro_batch::{Batch, Lost, MicroBatcher};
use crate::db::{PgPool, run_blocking};
use crate::endpoints::attempts::{self, NewAttempt};

/// Writes attempts in batches. Cloning shares the log.
#[derive(Debug, Clone)]
pub struct AttemptLog(MicroBatcher<Writer>);

impl AttemptLog {
    pub fn new(pool: PgPool) -> AttemptLog {
        AttemptLog(MicroBatcher::new(Writer { pool }))
    }

    /// Writes `attempt` with those of the other publishes ending now; an
    /// error says why it was not written.
    pub async fn record(&self, attempt: NewAttempt) -> Result<(), String> {
        self.0.ask(attempt).await.map_err(|lost| match lost {
            Lost::Stopped => "the attempt log has stopped".to_owned(),
            Lost::Dropped => "the attempt log dropped the attempt".to_owned(),
        })?
    }
}

/// One statement a batch; every attempt of it hears how that went.
#[derive(Debug)]
struct Writer {
    pool: PgPool,
}

impl Batch for Writer {
    type Request = NewAttempt;
    type Answer = Result<(), String>;
    /// Most attempts written in one statement.
    const MAX_BATCH: usize = 512;
    /// Most statements in flight at once.
    const MAX_IN_FLIGHT: usize = 2;

    async fn serve(&self, attempts: Vec<NewAttempt>) -> Vec<Result<(), String>> {
        let count = attempts.len();
        let written = run_blocking(&self.pool, move |conn| {
            Ok(attempts::record_many(conn, &attempts)?)
        })
        .await
        .map(drop)
        .map_err(|e| e.to_string());
        vec![written; count]
    }
}
