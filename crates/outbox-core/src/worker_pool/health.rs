//! Liveness: whether the worker pool is still making progress, for `/livez`.
//!
//! A worker pool can be frozen without any task having died: a claim that hangs, a
//! completer that cannot write a batch. Each loop stamps the moment it last
//! made progress; [`Liveness::check`] fails when one of them has not for
//! longer than the stall timeout while it had work to do. A database that does
//! not answer is not a liveness failure (restarting every worker pool would not bring
//! it back; `/readyz` reports it), so losing the database counts as "waiting".

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

/// One loop's progress stamps.
#[derive(Debug, Default)]
struct Stamp {
    /// Milliseconds since the worker pool started, of the last progress.
    at_ms: AtomicU64,
    /// Nothing to do (waiting for work, or for the database to come back).
    waiting: AtomicBool,
    /// Why the last attempt failed, while it keeps failing.
    error: Mutex<Option<String>>,
}

impl Stamp {
    fn set_error(&self, error: Option<String>) {
        *self.error.lock().unwrap_or_else(|e| e.into_inner()) = error;
    }
    fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[derive(Debug)]
struct State {
    started: Instant,
    stall_after: Duration,
    slots: Arc<Semaphore>,
    producer: Stamp,
    completer: Stamp,
    stopped: AtomicBool,
}

/// A handle on a worker pool's liveness; cheap to clone. See
/// [`crate::worker_pool::WorkerPool::liveness`].
#[derive(Debug, Clone)]
pub struct Liveness {
    state: Arc<State>,
}

impl Liveness {
    pub(super) fn new(stall_after: Duration, slots: Arc<Semaphore>) -> Self {
        Liveness {
            state: Arc::new(State {
                started: Instant::now(),
                stall_after,
                slots,
                producer: Stamp::default(),
                completer: Stamp {
                    waiting: AtomicBool::new(true),
                    ..Stamp::default()
                },
                stopped: AtomicBool::new(false),
            }),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.state.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn progress(&self, stamp: &Stamp, waiting: bool, error: Option<String>) {
        stamp.at_ms.store(self.now_ms(), Ordering::Release);
        stamp.waiting.store(waiting, Ordering::Release);
        stamp.set_error(error);
    }

    /// A claim came back (with jobs or without), or the producer went to sleep
    /// on an empty queue.
    pub(super) fn producer_progressed(&self) {
        self.progress(&self.state.producer, false, None);
    }

    /// A claim failed because the database could not be reached.
    pub(super) fn producer_waiting_for_database(&self, error: String) {
        self.progress(&self.state.producer, true, Some(error));
    }

    /// A claim was refused by the database: no progress, and this is why.
    pub(super) fn producer_failed(&self, error: String) {
        self.state.producer.set_error(Some(error));
    }

    /// Outcomes were written, or none are waiting.
    pub(super) fn completer_progressed(&self, idle: bool) {
        self.progress(&self.state.completer, idle, None);
    }

    /// A write failed because the database could not be reached.
    pub(super) fn completer_waiting_for_database(&self, error: String) {
        self.progress(&self.state.completer, true, Some(error));
    }

    /// A write failed for another reason: no progress, and this is why.
    pub(super) fn completer_failed(&self, error: String) {
        self.state.completer.waiting.store(false, Ordering::Release);
        self.state.completer.set_error(Some(error));
    }

    pub(super) fn stopped(&self) {
        self.state.stopped.store(true, Ordering::Release);
    }

    /// `Ok` while the worker pool makes progress; otherwise what is stuck and why.
    pub fn check(&self) -> Result<(), String> {
        let state = &self.state;
        if state.stopped.load(Ordering::Acquire) {
            return Err("the relay has stopped".to_owned());
        }
        let now = self.now_ms();
        let limit = u64::try_from(state.stall_after.as_millis()).unwrap_or(u64::MAX);
        let stalled = |stamp: &Stamp| {
            !stamp.waiting.load(Ordering::Acquire)
                && now.saturating_sub(stamp.at_ms.load(Ordering::Acquire)) > limit
        };
        // A producer with every slot busy is waiting for its effects (each
        // bounded by its deadline), not stuck.
        if state.slots.available_permits() > 0 && stalled(&state.producer) {
            return Err(format!(
                "the producer has claimed nothing for over {:?} although slots are free{}",
                state.stall_after,
                because(state.producer.error())
            ));
        }
        if stalled(&state.completer) {
            return Err(format!(
                "outcomes have waited over {:?} to be written{}",
                state.stall_after,
                because(state.completer.error())
            ));
        }
        Ok(())
    }
}

fn because(error: Option<String>) -> String {
    error.map(|e| format!(": {e}")).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_producer_refused_for_longer_than_the_stall_timeout_is_not_live() {
        let slots = Arc::new(Semaphore::new(1));
        let live = Liveness::new(Duration::from_millis(20), Arc::clone(&slots));
        live.producer_progressed();
        assert!(live.check().is_ok());
        live.producer_failed("new row violates check constraint".into());
        std::thread::sleep(Duration::from_millis(40));
        let error = live.check().expect_err("stalled");
        assert!(
            error.contains("producer") && error.contains("check constraint"),
            "{error}"
        );

        // Every slot busy: the producer is waiting for its effects.
        let _all = slots.try_acquire().expect("the one slot");
        assert!(live.check().is_ok());
    }

    #[test]
    fn a_database_outage_is_waiting_not_a_stall() {
        let live = Liveness::new(Duration::from_millis(10), Arc::new(Semaphore::new(4)));
        live.producer_waiting_for_database("connection refused".into());
        live.completer_waiting_for_database("connection refused".into());
        std::thread::sleep(Duration::from_millis(30));
        assert!(live.check().is_ok());
    }

    #[test]
    fn outcomes_that_cannot_be_written_make_the_relay_not_live() {
        let live = Liveness::new(Duration::from_millis(10), Arc::new(Semaphore::new(0)));
        live.completer_failed("statement timeout".into());
        std::thread::sleep(Duration::from_millis(30));
        assert!(live.check().expect_err("stalled").contains("outcomes"));
        live.completer_progressed(true);
        assert!(live.check().is_ok());
    }
}
