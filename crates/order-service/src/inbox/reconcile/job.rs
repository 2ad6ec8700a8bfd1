//! The relays' periodic reconciliation (`INBOX_RECONCILE_EVERY`): a core
//! periodic job, so one run per interval however many relays declare it,
//! whose worker reconciles every `stripe` source that has an API key.
//!
//! A source whose run fails (a refused key, Stripe down past its retries)
//! is logged once and recorded for the dashboard, and the job still ends
//! `done`: the next slot tries again, at the interval's pace, never sooner.
//! Only a database that cannot even record that fails the job, for the
//! core's backoff.

use std::time::Duration;

use outbox_core::outbox::{InvalidPeriodicJob, JobOptions, PeriodicJob};
use outbox_core::worker::{EffectError, EffectResult, JobArgs, JobContext, Worker};
use serde::{Deserialize, Serialize};

use super::{ReconcileError, Reconciler};
use crate::kinds::EffectKind;

/// The periodic job's name in `periodic_jobs` (`jobs schedules`).
pub const PERIODIC_NAME: &str = "inbox_reconcile";

/// One reconciliation of every source with an API key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxReconcile {}

impl JobArgs for InboxReconcile {
    const KIND: &'static str = EffectKind::InboxReconcile.as_str();
}

/// The periodic job a relay declares: [`InboxReconcile`] every `every`.
pub fn periodic_job(every: Duration) -> Result<PeriodicJob, InvalidPeriodicJob> {
    // Its failures are the database's; the next slot comes soon enough.
    let options = JobOptions {
        max_attempts: Some(3),
        ..JobOptions::default()
    };
    Ok(PeriodicJob::every(PERIODIC_NAME, every, &InboxReconcile {})?.options(&options))
}

/// Performs [`InboxReconcile`].
#[derive(Debug, Clone)]
pub struct ReconcileWorker {
    pub reconciler: Reconciler,
}

impl Worker<InboxReconcile> for ReconcileWorker {
    async fn work(&self, _args: InboxReconcile, _ctx: JobContext) -> EffectResult {
        let outcomes = self.reconciler.every_source(None).await.map_err(|e| {
            EffectError::retryable(format!("reading the sources to reconcile: {e}"))
        })?;
        let mut database = None;
        for (source, outcome) in outcomes {
            match outcome {
                Ok(report) if report.recovered > 0 => tracing::warn!(
                    source,
                    fetched = report.fetched,
                    recovered = report.recovered,
                    already = report.already,
                    pages = report.pages,
                    "reconcile recovered events the provider's webhooks never delivered"
                ),
                Ok(report) => tracing::debug!(
                    source,
                    fetched = report.fetched,
                    already = report.already,
                    pages = report.pages,
                    "reconciled; nothing missing"
                ),
                Err(error @ ReconcileError::Database { .. }) => {
                    tracing::error!(source, %error, "reconcile failed");
                    database = Some(error);
                }
                Err(error) => tracing::error!(
                    source,
                    %error,
                    "reconcile failed; the next run tries again"
                ),
            }
        }
        match database {
            Some(error) => Err(EffectError::retryable(error.to_string())),
            None => Ok(None),
        }
    }
}
