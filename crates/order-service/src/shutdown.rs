//! Turning SIGTERM and SIGINT into a cancellation the whole process selects on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub use tokio_util::sync::CancellationToken;

type Cleanup = Arc<dyn Fn() + Send + Sync>;

/// Work that must happen even when a second signal skips every destructor:
/// stopping a server this process started, say, which would otherwise outlive it.
static FORCED_EXIT_CLEANUPS: Mutex<Vec<(u64, Cleanup)>> = Mutex::new(Vec::new());
static NEXT_CLEANUP: AtomicU64 = AtomicU64::new(0);

fn cleanups() -> MutexGuard<'static, Vec<(u64, Cleanup)>> {
    // Pushes and removes only; a poisoned list is still whole.
    FORCED_EXIT_CLEANUPS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Runs `cleanup` if the process exits on a second signal while the returned
/// guard is alive. Dropping the guard (after the normal cleanup ran) removes it.
#[must_use = "the cleanup is removed when the guard is dropped"]
pub fn on_forced_exit(cleanup: impl Fn() + Send + Sync + 'static) -> ForcedExitCleanup {
    let id = NEXT_CLEANUP.fetch_add(1, Ordering::Relaxed);
    cleanups().push((id, Arc::new(cleanup)));
    ForcedExitCleanup { id }
}

/// See [`on_forced_exit`].
#[derive(Debug)]
pub struct ForcedExitCleanup {
    id: u64,
}

impl Drop for ForcedExitCleanup {
    fn drop(&mut self) {
        cleanups().retain(|(id, _)| *id != self.id);
    }
}

/// Runs every registered cleanup, newest first.
fn run_forced_exit_cleanups() {
    let pending: Vec<Cleanup> = cleanups()
        .iter()
        .rev()
        .map(|(_, c)| Arc::clone(c))
        .collect();
    for cleanup in pending {
        cleanup();
    }
}

/// Returns a token cancelled on the first SIGTERM or SIGINT. A second signal
/// exits at once (status 130), for the operator who really means it, after
/// the [`on_forced_exit`] cleanups.
pub fn on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested; finishing in-flight work (signal again to exit now)");
        cancel.cancel();
        wait_for_signal().await;
        tracing::warn!("second signal: exiting without waiting");
        run_forced_exit_cleanups();
        std::process::exit(130);
    });
    token
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    #[test]
    fn a_forced_exit_runs_the_live_cleanups_only() {
        let ran = Arc::new(AtomicUsize::new(0));
        let counter = |n: usize| {
            let ran = Arc::clone(&ran);
            move || {
                ran.fetch_add(n, Ordering::SeqCst);
            }
        };
        let kept = on_forced_exit(counter(1));
        let removed = on_forced_exit(counter(10));
        drop(removed);
        run_forced_exit_cleanups();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        drop(kept);
        run_forced_exit_cleanups();
        assert_eq!(
            ran.load(Ordering::SeqCst),
            1,
            "a dropped guard's cleanup never runs"
        );
    }
}
