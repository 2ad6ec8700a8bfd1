//! The per-kind metric handles a job touches on its way through the pool,
//! looked up once per kind instead of once per job.
//!
//! A `metrics::counter!` with a label builds its key, hashes it and looks it
//! up in the recorder's registry on every call; with three such calls a job
//! (claimed, effect duration, finished) that was a tenth of the relay's
//! instructions on a no-op drain. A handle is an `Arc` of the recorder's own
//! atomic, so keeping it is what the recorder itself would do on a hit.
//!
//! Handles are bound to the recorder installed when a kind's first job runs
//! in this pool: a recorder is installed before the pool starts (the relay
//! does so at start-up), as the `metrics` crate asks of every library.
//! Rare outcomes (a lost lease, a timeout, a refused write) keep the macro:
//! a handle taken up front would show every kind's zero series.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use metrics::{Counter, Histogram};

/// One kind's handles. The job's kind travels with them, shared, so a job
/// carries its kind to the completer without copying the string.
#[derive(Debug)]
pub(super) struct KindMetrics {
    pub(super) kind: Arc<str>,
    pub(super) claimed: Counter,
    pub(super) effect_duration: Histogram,
    done: OnceLock<Counter>,
    retried: OnceLock<Counter>,
    failed: OnceLock<Counter>,
}

impl KindMetrics {
    fn new(kind: &str) -> KindMetrics {
        let label = kind.to_owned();
        KindMetrics {
            kind: Arc::from(kind),
            claimed: metrics::counter!("outbox_jobs_claimed_total", "kind" => label.clone()),
            effect_duration: metrics::histogram!("outbox_effect_duration_seconds", "kind" => label),
            done: OnceLock::new(),
            retried: OnceLock::new(),
            failed: OnceLock::new(),
        }
    }

    /// `outbox_jobs_finished_total{kind, outcome}`, for `done`, `retried` or
    /// `failed`; each series is made on its first use.
    pub(super) fn finished(&self, outcome: &'static str) -> &Counter {
        let cell = match outcome {
            "done" => &self.done,
            "retried" => &self.retried,
            _ => &self.failed,
        };
        cell.get_or_init(|| {
            metrics::counter!(
                "outbox_jobs_finished_total",
                "kind" => self.kind.to_string(),
                "outcome" => outcome
            )
        })
    }
}

/// The handles of every kind this pool has run.
#[derive(Debug, Default)]
pub(super) struct KindMetricsCache(RwLock<HashMap<Box<str>, Arc<KindMetrics>>>);

impl KindMetricsCache {
    /// `kind`'s handles, made on its first job.
    pub(super) fn of(&self, kind: &str) -> Arc<KindMetrics> {
        if let Some(found) = self.0.read().unwrap_or_else(|e| e.into_inner()).get(kind) {
            return Arc::clone(found);
        }
        let mut kinds = self.0.write().unwrap_or_else(|e| e.into_inner());
        Arc::clone(
            kinds
                .entry(Box::from(kind))
                .or_insert_with(|| Arc::new(KindMetrics::new(kind))),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_is_looked_up_once_and_shared() {
        let cache = KindMetricsCache::default();
        let first = cache.of("email");
        let again = cache.of("email");
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(&*first.kind, "email");
        assert!(!Arc::ptr_eq(&first, &cache.of("webhook")));
    }
}
