//! The heartbeat: keeps the leases of in-flight jobs alive, one UPDATE for all.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::Shared;
use crate::db::run_blocking;
use crate::outbox::extend_leases;

pub(super) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let mut ticks = tokio::time::interval(shared.settings.heartbeat_interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let leases = shared.leases();
        if leases.is_empty() {
            continue;
        }
        let worker = shared.settings.worker_id.clone();
        let lease = shared.settings.lease;
        let asked = leases.len();
        match run_blocking(&shared.pool, move |conn| {
            Ok(extend_leases(conn, &worker, &leases, lease)?)
        })
        .await
        {
            Ok(kept) if kept.len() < asked => {
                // Some jobs finished between the snapshot and the update (normal),
                // or were reaped and re-claimed (the completer will count those).
                tracing::debug!(
                    asked,
                    kept = kept.len(),
                    "heartbeat extended fewer leases than asked"
                );
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(error = %error, jobs = asked, "heartbeat failed; leases may expire")
            }
        }
    }
}
