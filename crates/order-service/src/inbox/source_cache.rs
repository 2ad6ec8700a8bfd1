//! The sources as `POST /inbound/{source}` sees them: a snapshot of the whole
//! `sources` table, at most [`SOURCE_CACHE_TTL`] old.
//!
//! A message is verified before it takes a database connection, so the
//! secrets it is checked against cannot be read per request. A snapshot of
//! every source answers every name, unknown ones included: a flood of made-up
//! source names costs no query at all, where a cache of names seen would
//! query once per new name. One refresh runs at a time, started by the first
//! request that finds the snapshot older than the TTL; the others wait for
//! it, so the cache holds at most one connection, once per TTL.
//!
//! A source added, rotated or removed takes effect within the TTL; the
//! previous secret's expiry is kept in the snapshot and checked against the
//! clock of each message, so it ends on time however old the snapshot is.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::source::Source;

/// How old the snapshot of sources may be when a message is verified with
/// it: a source added or rotated with `sources …` takes effect within this.
pub const SOURCE_CACHE_TTL: Duration = Duration::from_secs(2);

/// Signature checks running at once at most, each on a blocking thread. A
/// check costs one MAC of at most 256 KiB per secret (about a millisecond);
/// past this many, checks wait their turn instead of taking more threads.
pub const MAX_CHECKS: usize = 4;

/// What `/inbound` holds besides the pool: the sources, and the turns of the
/// signature checks.
#[derive(Debug)]
pub struct InboundGate {
    pub(crate) sources: SourceCache,
    pub(crate) checks: Arc<Semaphore>,
}

impl InboundGate {
    /// Sources at most `ttl` old.
    pub fn new(ttl: std::time::Duration) -> InboundGate {
        InboundGate {
            sources: SourceCache::new(ttl),
            checks: Arc::new(Semaphore::new(MAX_CHECKS)),
        }
    }
}

/// The sources by name, and when the query that read them started.
#[derive(Clone)]
struct Snapshot {
    by_name: Arc<HashMap<String, Source>>,
    taken_at: Instant,
}

/// Every source, refreshed when older than its TTL, one refresh at a time.
pub struct SourceCache {
    ttl: Duration,
    snapshot: Mutex<Option<Snapshot>>,
    /// Held while a refresh runs: later requests wait for it, not query.
    refreshing: tokio::sync::Mutex<()>,
}

impl fmt::Debug for SourceCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SourceCache")
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Default for SourceCache {
    fn default() -> Self {
        SourceCache::new(SOURCE_CACHE_TTL)
    }
}

impl SourceCache {
    pub fn new(ttl: Duration) -> SourceCache {
        SourceCache {
            ttl,
            snapshot: Mutex::new(None),
            refreshing: tokio::sync::Mutex::new(()),
        }
    }

    /// The source named `name`, if any, from a snapshot at most the TTL
    /// old; `load` reads every source when the snapshot must be refreshed.
    /// A failed refresh is the caller's error and leaves the old snapshot in
    /// place: the next request tries again.
    pub async fn find<F, Fut, E>(&self, name: &str, load: F) -> Result<Option<Source>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<Source>, E>>,
    {
        Ok(self.current(load).await?.get(name).cloned())
    }

    async fn current<F, Fut, E>(&self, load: F) -> Result<Arc<HashMap<String, Source>>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<Source>, E>>,
    {
        if let Some(fresh) = self.fresh() {
            return Ok(fresh);
        }
        let _one = self.refreshing.lock().await;
        // The refresh this request waited for may have done it.
        if let Some(fresh) = self.fresh() {
            return Ok(fresh);
        }
        // Taken before the query: a change committed before it started is in
        // the rows, so every change is seen within the TTL of its commit.
        let taken_at = Instant::now();
        let by_name: Arc<HashMap<String, Source>> = Arc::new(
            load()
                .await?
                .into_iter()
                .map(|source| (source.name.clone(), source))
                .collect(),
        );
        *self.slot() = Some(Snapshot {
            by_name: Arc::clone(&by_name),
            taken_at,
        });
        Ok(by_name)
    }

    fn fresh(&self) -> Option<Arc<HashMap<String, Source>>> {
        self.slot()
            .as_ref()
            .filter(|snapshot| snapshot.taken_at.elapsed() < self.ttl)
            .map(|snapshot| Arc::clone(&snapshot.by_name))
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Snapshot>> {
        // Only ever replaced whole: a panic cannot leave it half-written.
        self.snapshot.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_lookups_of_unknown_names_share_one_refresh_per_ttl() {
        let cache = Arc::new(SourceCache::new(Duration::from_secs(60)));
        let loads = Arc::new(AtomicUsize::new(0));
        let lookups = (0..64).map(|i| {
            let (cache, loads) = (Arc::clone(&cache), Arc::clone(&loads));
            tokio::spawn(async move {
                cache
                    .find(&format!("made-up-{i}"), || async {
                        loads.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Ok::<_, ()>(Vec::new())
                    })
                    .await
            })
        });
        for lookup in lookups {
            assert!(matches!(lookup.await.expect("joined"), Ok(None)));
        }
        assert_eq!(loads.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_failed_refresh_is_the_callers_error_and_the_next_one_tries_again() {
        let cache = SourceCache::new(Duration::ZERO);
        let failed = cache
            .find("stripe", || async { Err::<Vec<Source>, _>("down") })
            .await;
        assert!(matches!(failed, Err("down")));
        let next = cache
            .find("stripe", || async { Ok::<_, &str>(Vec::new()) })
            .await;
        assert!(matches!(next, Ok(None)));
    }
}
