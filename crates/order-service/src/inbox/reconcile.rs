//! Reconciliation: the events a provider's log lists that never arrived as
//! webhooks, applied as if they had (`inbox reconcile`, and the relays'
//! periodic job, [`job`]). [`stripe_events`] reads Stripe's log;
//! [`state`] keeps each source's watermark and last run.
//!
//! Not a second implementation of the inbox: each listed event goes through
//! [`receive`], the webhook's own apply path, in its own transaction, stored
//! with `via = reconcile`. One already stored (sent by webhook, or recovered
//! by an earlier run) is a repeat there and changes nothing. A run that
//! fails half-way has applied what it applied, each event whole, and moves
//! no watermark: the next run asks for the same events again.

pub mod api_key;
pub mod job;
pub mod state;
pub mod stripe_events;

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use self::state::RunCounts;
use self::stripe_events::{ListedEvent, StripeError, StripeEvents};
use super::Via;
use super::apply::{Answer, receive};
use super::event::Message;
use super::source::{self, Source, SourceKind};
use crate::db::{DbError, PgPool, run_blocking};
use crate::outbox::Enqueuer;
use crate::sealed::{Keyring, Unreadable};

/// How far back a source's first run looks, with no watermark yet and no
/// `--since`: Stripe's webhook retries span three days.
pub const DEFAULT_SINCE: Duration = Duration::from_secs(72 * 3600);

/// The watermark is this much older than the newest event a run saw: an
/// event created just before it may be listed only after it.
pub const WATERMARK_OVERLAP: Duration = Duration::from_secs(10 * 60);

/// Pages one run reads at most: 30 days of a busy account is far fewer;
/// a log that pages without end is cut off, not followed forever.
const MAX_PAGES: u64 = 10_000;

/// What one source's run did (`inbox reconcile --json` prints these counts).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    pub source: String,
    /// Events the log listed.
    pub fetched: u64,
    /// Listed and not yet in the inbox: applied now, `via = reconcile`.
    pub recovered: u64,
    /// Listed and already in the inbox: nothing changed.
    pub already: u64,
    pub pages: u64,
    /// Events created from this time on were asked for.
    pub since: Option<DateTime<Utc>>,
}

/// Why a source was not reconciled.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("there is no source named {0:?} (see `outbox-relay sources list`)")]
    NotFound(String),
    #[error("source {0:?} is a standard source: only stripe sources are reconciled")]
    NotStripe(String),
    #[error(
        "source {0:?} has no API key: give it one with `outbox-relay sources set-api-key {0} \
         --api-key-file PATH`"
    )]
    NoApiKey(String),
    #[error(transparent)]
    Unreadable(#[from] Unreadable),
    #[error(transparent)]
    Stripe(#[from] StripeError),
    #[error("reconciling source {name:?}: {error}")]
    Database { name: String, error: DbError },
}

/// Reconciles sources against Stripe's log, applying what it lists.
#[derive(Debug, Clone)]
pub struct Reconciler {
    pub pool: PgPool,
    pub events: StripeEvents,
    /// Opens the sources' sealed API keys.
    pub keys: Keyring,
    /// The service's enqueuer ([`crate::orders::order_enqueuer`]): an
    /// applied payment enqueues its order's jobs.
    pub enqueuer: Enqueuer,
    /// `max_attempts` of the jobs an applied event enqueues.
    pub max_attempts: i32,
}

impl Reconciler {
    /// Reconciles source `name`: every event created since `since` ago (or
    /// since its watermark, or [`DEFAULT_SINCE`] ago) that is not in the
    /// inbox is applied. The outcome is recorded for the dashboard either way.
    pub async fn source(
        &self,
        name: &str,
        since: Option<Duration>,
    ) -> Result<Report, ReconcileError> {
        let found = {
            let owned = name.to_owned();
            run_blocking(&self.pool, move |conn| {
                let source = source::find(conn, &owned)?;
                let watermark = match &source {
                    Some(s) => state::watermark(conn, s.id)?,
                    None => None,
                };
                Ok((source, watermark))
            })
            .await
            .map_err(|error| ReconcileError::Database {
                name: name.to_owned(),
                error,
            })?
        };
        let (Some(source), watermark) = found else {
            return Err(ReconcileError::NotFound(name.to_owned()));
        };
        if source.kind() != SourceKind::Stripe {
            return Err(ReconcileError::NotStripe(source.name));
        }
        let id = source.id;
        let key = match source.api_key(&self.keys) {
            Ok(Some(key)) => key,
            Ok(None) => return Err(ReconcileError::NoApiKey(source.name)),
            // A key sealed under a key this process lacks: the dashboard
            // shows it as the source's last error, as a refused key.
            Err(unreadable) => {
                let error = ReconcileError::from(unreadable);
                let message = error.to_string();
                self.record(&source, move |conn| {
                    state::failed(conn, id, &RunCounts::default(), &message)
                })
                .await?;
                return Err(error);
            }
        };
        let now = Utc::now();
        let since = match (since, watermark) {
            (Some(ago), _) => ago_from(now, ago),
            (None, Some(watermark)) => watermark,
            (None, None) => ago_from(now, DEFAULT_SINCE),
        };
        self.record(&source, move |conn| state::started(conn, id))
            .await?;
        let mut run = Run {
            report: Report {
                source: source.name.clone(),
                since: Some(since),
                ..Report::default()
            },
            newest: None,
        };
        let outcome = self.pages(&source, &key, since, &mut run).await;
        let counts = run.counts();
        let result = match outcome {
            Ok(()) => {
                let watermark = run
                    .newest
                    .map(|created| ago_from(created, WATERMARK_OVERLAP));
                self.record(&source, move |conn| {
                    state::succeeded(conn, id, &counts, watermark)
                })
                .await?;
                Ok(run.report)
            }
            Err(error) => {
                let message = error.to_string();
                self.record(&source, move |conn| {
                    state::failed(conn, id, &counts, &message)
                })
                .await?;
                Err(error)
            }
        };
        metrics::counter!(
            "outbox_inbox_reconcile_runs_total",
            "source" => source.name.clone(),
            "result" => if result.is_ok() { "ok" } else { "error" },
        )
        .increment(1);
        result
    }

    /// Reconciles every `stripe` source with an API key, one after another
    /// (`since` as for [`Reconciler::source`]); each source's outcome on its
    /// own. None has a key: one cheap read.
    pub async fn every_source(
        &self,
        since: Option<Duration>,
    ) -> Result<Vec<(String, Result<Report, ReconcileError>)>, DbError> {
        let names = self.reconciled_sources().await?;
        let mut outcomes = Vec::with_capacity(names.len());
        for name in names {
            let outcome = self.source(&name, since).await;
            outcomes.push((name, outcome));
        }
        Ok(outcomes)
    }

    /// The names of the `stripe` sources with an API key.
    pub async fn reconciled_sources(&self) -> Result<Vec<String>, DbError> {
        run_blocking(&self.pool, |conn| {
            Ok(source::list(conn)?
                .into_iter()
                .filter(|s| s.kind() == SourceKind::Stripe && s.has_api_key())
                .map(|s| s.name)
                .collect::<Vec<_>>())
        })
        .await
    }

    async fn pages(
        &self,
        source: &Source,
        key: &str,
        since: DateTime<Utc>,
        run: &mut Run,
    ) -> Result<(), ReconcileError> {
        let mut after: Option<String> = None;
        while run.report.pages < MAX_PAGES {
            let page = self
                .events
                .page(&source.name, key, since.timestamp(), after.as_deref())
                .await?;
            run.report.pages += 1;
            let last = page.events.last().map(|e| e.id.clone());
            self.apply_page(source, page.events, run).await?;
            // A log that hands back the cursor it was given would page forever.
            if !page.has_more || last.is_none() || last == after {
                return Ok(());
            }
            after = last;
        }
        tracing::warn!(
            source = %source.name,
            pages = MAX_PAGES,
            "reconcile stopped after the most pages a run reads; the next run goes on from there"
        );
        Ok(())
    }

    /// Applies a page's events, each in its own transaction.
    async fn apply_page(
        &self,
        source: &Source,
        events: Vec<ListedEvent>,
        run: &mut Run,
    ) -> Result<(), ReconcileError> {
        let (name, kind, mode) = (source.name.clone(), source.kind(), source.mode());
        let (enqueuer, max_attempts) = (self.enqueuer.clone(), self.max_attempts);
        let fetched = events.len();
        let newest = events.iter().map(|e| e.created).max();
        let (recovered, already) = run_blocking(&self.pool, move |conn| {
            let (mut recovered, mut already) = (0u64, 0u64);
            for event in events {
                let message =
                    Message::read(&name, kind, mode, event.id, event.payload, Via::Reconcile);
                match receive(conn, &enqueuer, &message, max_attempts)? {
                    Answer::Recorded { .. } => recovered += 1,
                    Answer::Repeat { .. } => already += 1,
                }
            }
            Ok((recovered, already))
        })
        .await
        .map_err(|error| ReconcileError::Database {
            name: source.name.clone(),
            error,
        })?;
        run.report.fetched += u64::try_from(fetched).unwrap_or(u64::MAX);
        run.report.recovered += recovered;
        run.report.already += already;
        if let Some(created) = newest.and_then(|s| DateTime::from_timestamp(s, 0)) {
            run.newest = run.newest.max(Some(created));
        }
        Ok(())
    }

    async fn record<F>(&self, source: &Source, write: F) -> Result<(), ReconcileError>
    where
        F: FnOnce(&mut diesel::PgConnection) -> diesel::QueryResult<()> + Send + 'static,
    {
        run_blocking(&self.pool, move |conn| Ok(write(conn)?))
            .await
            .map_err(|error| ReconcileError::Database {
                name: source.name.clone(),
                error,
            })
    }
}

/// What a run has done so far.
struct Run {
    report: Report,
    /// The `created` of the newest event seen.
    newest: Option<DateTime<Utc>>,
}

impl Run {
    /// The counts as `source_reconciliations` stores them.
    fn counts(&self) -> RunCounts {
        let n = |v: u64| i32::try_from(v).unwrap_or(i32::MAX);
        RunCounts {
            fetched: n(self.report.fetched),
            recovered: n(self.report.recovered),
            already: n(self.report.already),
            pages: n(self.report.pages),
        }
    }
}

/// `at` less `ago`; the earliest time there is when that is before it.
fn ago_from(at: DateTime<Utc>, ago: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(ago)
        .ok()
        .and_then(|ago| at.checked_sub_signed(ago))
        .unwrap_or(DateTime::UNIX_EPOCH)
}
