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
//! as [`loader`](super::loader) does for reads: the task takes every attempt
//! waiting at that moment, up to `MAX_BATCH`, and writes them in one
//! statement; attempts arriving meanwhile form the next batch. The job
//! finishes after its attempt is written, so an operator who sees it done
//! sees its attempt. A write that fails is logged, never the job's failure:
//! the publish happened either way.

use std::sync::{Arc, OnceLock};

use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::db::{PgPool, run_blocking};
use crate::endpoints::attempts::{self, NewAttempt};

/// Most attempts written in one statement.
const MAX_BATCH: usize = 512;
/// Most statements in flight at once: a slow database makes batches larger
/// rather than taking every pooled connection.
const MAX_WRITES: usize = 2;

struct Request {
    attempt: NewAttempt,
    reply: oneshot::Sender<Result<(), String>>,
}

/// Writes attempts in batches. Cloning shares the log.
#[derive(Debug, Clone)]
pub struct AttemptLog {
    pool: PgPool,
    /// Made on first use, inside the relay's runtime.
    requests: Arc<OnceLock<mpsc::UnboundedSender<Request>>>,
}

impl AttemptLog {
    pub fn new(pool: PgPool) -> AttemptLog {
        AttemptLog {
            pool,
            requests: Arc::default(),
        }
    }

    /// Writes `attempt` with those of the other publishes ending now; an
    /// error says why it was not written.
    pub async fn record(&self, attempt: NewAttempt) -> Result<(), String> {
        let requests = self.requests.get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(run(self.pool.clone(), receiver));
            sender
        });
        let (reply, answer) = oneshot::channel();
        requests
            .send(Request { attempt, reply })
            .map_err(|_| "the attempt log has stopped".to_owned())?;
        answer
            .await
            .map_err(|_| "the attempt log dropped the attempt".to_owned())?
    }
}

/// Serves attempts until every [`AttemptLog`] sharing the inbox is gone.
async fn run(pool: PgPool, mut requests: mpsc::UnboundedReceiver<Request>) {
    let writes = Arc::new(Semaphore::new(MAX_WRITES));
    while let Some(first) = requests.recv().await {
        let Ok(permit) = Arc::clone(&writes).acquire_owned().await else {
            return;
        };
        // Publishes of one claim end close together: let them reach the
        // inbox before the batch is closed.
        tokio::task::yield_now().await;
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match requests.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        let pool = pool.clone();
        tokio::spawn(async move {
            write(&pool, batch).await;
            drop(permit);
        });
    }
}

async fn write(pool: &PgPool, batch: Vec<Request>) {
    let (attempts, replies): (Vec<NewAttempt>, Vec<_>) =
        batch.into_iter().map(|r| (r.attempt, r.reply)).unzip();
    let written = run_blocking(pool, move |conn| {
        Ok(attempts::record_many(conn, &attempts)?)
    })
    .await
    .map(drop)
    .map_err(|e| e.to_string());
    for reply in replies {
        // The job may have been cancelled meanwhile: nobody to tell.
        let _ = reply.send(written.clone());
    }
}
