//! Turning SIGTERM and SIGINT into a cancellation the whole process selects on.

use tokio_util::sync::CancellationToken;

/// Returns a token cancelled on the first SIGTERM or SIGINT. A second signal
/// exits at once (status 130), for the operator who really means it.
pub fn on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested; finishing in-flight work (signal again to exit now)");
        cancel.cancel();
        wait_for_signal().await;
        tracing::warn!("second signal: exiting without waiting");
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
