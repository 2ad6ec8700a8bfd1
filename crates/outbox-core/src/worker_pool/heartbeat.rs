//! The heartbeat: keeps the leases of in-flight claims alive, one UPDATE for
//! all, and stops the effects whose lease turns out to be lost.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio_util::sync::CancellationToken;

use super::Shared;

pub(super) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let mut ticks = tokio::time::interval(shared.settings.heartbeat_interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
            // The reaper asks for a beat before it reaps, after an outage.
            () = shared.beat_now.notified() => {}
        }
        beat(&shared).await;
    }
}

async fn beat(shared: &Arc<Shared>) {
    let leases = shared.in_flight.leases();
    if leases.is_empty() {
        shared.heartbeat_ok.store(true, Ordering::Release);
        return;
    }
    let asked = leases.len();
    match shared.hot.extend(leases).await {
        Ok(report) => {
            if !shared.heartbeat_ok.swap(true, Ordering::AcqRel) {
                tracing::info!(jobs = asked, "heartbeat renews leases again");
            }
            if !report.busy.is_empty() {
                tracing::debug!(
                    busy = report.busy.len(),
                    "rows locked elsewhere; their leases are renewed at the next beat"
                );
            }
            for lost in &report.lost {
                // Missing because its outcome was written meanwhile (then the
                // claim has ended and this does nothing), or because another
                // worker pool reaped it or an operator cancelled it: stop the effect.
                if shared.in_flight.lose(lost.lease_token) {
                    tracing::debug!(
                        job_id = lost.job_id,
                        lease_token = lost.lease_token,
                        "heartbeat found the lease lost"
                    );
                }
            }
        }
        Err(error) => {
            if shared.heartbeat_ok.swap(false, Ordering::AcqRel) {
                tracing::warn!(error = %error, jobs = asked, "heartbeat failed; leases may expire");
            }
        }
    }
}
