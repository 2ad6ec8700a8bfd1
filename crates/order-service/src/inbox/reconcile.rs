//! Reconciliation: the events a provider's log lists that never arrived as
//! webhooks, applied as if they had (`inbox reconcile`, and the relays'
//! periodic job, [`job`]). [`stripe_events`] reads Stripe's log;
//! [`state`] keeps each source's watermark and last run.
//!
//! Not a second implementation of the inbox: each listed event goes through
//! [`receive`], the webhook's own apply path, in its own transaction, stored
//! with `via = reconcile`. One already stored (sent by webhook, or recovered
//! by an earlier run) is a repeat there and changes nothing.
//!
//! The log lists newest first; a run reads all of it before applying, keeps
//! only the events the inbox lacks, and applies those oldest first, as the
//! provider created them: a refund never lands before the payment it
//! refunds. A run that fails half-way has applied what it applied, each
//! event whole, and moves no watermark; nor does one that was cut off, or
//! one whose `--since` began after the watermark: the next run asks for the
//! same events again.

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

/// Events missing from the inbox that one run holds at most before it
/// applies them (their payloads are kept in memory until then); past it the
/// run is cut off, applies what it holds and keeps the watermark.
const MAX_MISSING: usize = 10_000;

/// Events applied per blocking call (each still in its own transaction).
const APPLY_CHUNK: usize = 100;

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
    /// The run stopped before the end of the log (too many pages or
    /// missing events): the watermark stays, the next run reads again.
    pub cut_off: bool,
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
        let from = watermark.unwrap_or_else(|| ago_from(now, DEFAULT_SINCE));
        let since = since.map_or(from, |ago| ago_from(now, ago));
        // A run that began after the point the next one would begin at has
        // not read the events in between: it must not move the watermark
        // past them.
        let covers = since <= from;
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
        let outcome = match self.pages(&source, &key, since, &mut run).await {
            Ok(missing) => self.apply(&source, missing, &mut run).await,
            Err(error) => Err(error),
        };
        let counts = run.counts();
        let result = match outcome {
            Ok(()) => {
                let watermark = run
                    .newest
                    .filter(|_| covers && !run.report.cut_off)
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

    /// Reads the log from `since` to its end and returns the events the
    /// inbox lacks, oldest first. Events already stored are counted, not kept.
    async fn pages(
        &self,
        source: &Source,
        key: &str,
        since: DateTime<Utc>,
        run: &mut Run,
    ) -> Result<Vec<ListedEvent>, ReconcileError> {
        let mut missing: Vec<ListedEvent> = Vec::new();
        let mut after: Option<String> = None;
        loop {
            if run.report.pages >= MAX_PAGES || missing.len() >= MAX_MISSING {
                run.report.cut_off = true;
                tracing::warn!(
                    source = %source.name,
                    pages = run.report.pages,
                    missing = missing.len(),
                    "reconcile stopped before the end of stripe's log; it applies what it \
                     read and keeps the watermark, so the next run reads again"
                );
                break;
            }
            let page = self
                .events
                .page(&source.name, key, since.timestamp(), after.as_deref())
                .await?;
            run.report.pages += 1;
            let last = page.events.last().map(|e| e.id.clone());
            run.see(&page.events);
            missing.extend(self.not_stored(source, page.events, run).await?);
            // A log that hands back the cursor it was given would page forever.
            if !page.has_more || last.is_none() || last == after {
                break;
            }
            after = last;
        }
        // Listed newest first: reversed, then ordered by creation (stable,
        // so events of one second keep the log's order).
        missing.reverse();
        missing.sort_by_key(|event| event.created);
        Ok(missing)
    }

    /// The page's events that are not in the inbox yet: one read per page.
    async fn not_stored(
        &self,
        source: &Source,
        events: Vec<ListedEvent>,
        run: &mut Run,
    ) -> Result<Vec<ListedEvent>, ReconcileError> {
        let name = source.name.clone();
        let ids: Vec<String> = events.iter().map(|e| e.id.clone()).collect();
        let stored = run_blocking(&self.pool, move |conn| {
            Ok(super::list::stored_message_ids(conn, &name, &ids)?)
        })
        .await
        .map_err(|error| ReconcileError::Database {
            name: source.name.clone(),
            error,
        })?;
        let listed = events.len();
        let missing: Vec<ListedEvent> = events
            .into_iter()
            .filter(|event| !stored.contains(&event.id))
            .collect();
        run.report.already += u64::try_from(listed - missing.len()).unwrap_or(u64::MAX);
        Ok(missing)
    }

    /// Applies the missing events in the order given, each in its own
    /// transaction; one that arrived by webhook meanwhile is a repeat.
    async fn apply(
        &self,
        source: &Source,
        missing: Vec<ListedEvent>,
        run: &mut Run,
    ) -> Result<(), ReconcileError> {
        let (kind, mode) = (source.kind(), source.mode());
        for chunk in missing.chunks(APPLY_CHUNK) {
            let (name, enqueuer, jobs) = (
                source.name.clone(),
                self.enqueuer.clone(),
                self.max_attempts,
            );
            let chunk = chunk.to_vec();
            let outcome = run_blocking(&self.pool, move |conn| {
                let (mut recovered, mut already) = (0u64, 0u64);
                for event in chunk {
                    let message =
                        Message::read(&name, kind, mode, event.id, event.payload, Via::Reconcile);
                    match receive(conn, &enqueuer, &message, jobs) {
                        Ok(Answer::Recorded { .. }) => recovered += 1,
                        Ok(Answer::Repeat { .. }) => already += 1,
                        Err(error) => return Ok(((recovered, already), Some(error))),
                    }
                }
                Ok(((recovered, already), None))
            })
            .await
            .map_err(|error| ReconcileError::Database {
                name: source.name.clone(),
                error,
            })?;
            let ((recovered, already), failed) = outcome;
            run.report.recovered += recovered;
            run.report.already += already;
            if let Some(error) = failed {
                return Err(ReconcileError::Database {
                    name: source.name.clone(),
                    error: error.into(),
                });
            }
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
    /// Counts a page as listed and moves `newest`.
    fn see(&mut self, events: &[ListedEvent]) {
        self.report.fetched += u64::try_from(events.len()).unwrap_or(u64::MAX);
        let newest = events.iter().map(|e| e.created).max();
        if let Some(created) = newest.and_then(|s| DateTime::from_timestamp(s, 0)) {
            self.newest = self.newest.max(Some(created));
        }
    }

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
