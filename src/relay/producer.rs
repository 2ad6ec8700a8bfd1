//! The producer: claims due jobs into free slots and starts their effects.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_util::sync::CancellationToken;

use super::{InFlight, RelayStats, Shared, executor};
use crate::db::run_blocking;
use crate::outbox::{ClaimRequest, ClaimedJob, Finish, JobLease, claim_jobs, release_jobs};

/// Claims and starts jobs until `shutdown`. Each claim asks for at most the
/// number of free slots, so a job is never claimed without a slot to run it in.
pub(super) async fn run(
    shared: Arc<Shared>,
    completions: mpsc::Sender<Finish>,
    shutdown: CancellationToken,
    interrupt: CancellationToken,
) {
    let settings = &shared.settings;
    let mut claim_failing = false;
    loop {
        // Wait for one free slot, then take whatever else is free without waiting.
        let first = tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            permit = Arc::clone(&shared.slots).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return, // the semaphore is never closed; treat as shutdown
            },
        };
        let mut permits = vec![first];
        while permits.len() < settings.batch_size {
            match Arc::clone(&shared.slots).try_acquire_owned() {
                Ok(permit) => permits.push(permit),
                Err(_) => break,
            }
        }

        let wanted = permits.len();
        let claimed = claim(&shared, wanted).await;
        let jobs = match claimed {
            Ok(jobs) => {
                if claim_failing {
                    tracing::info!("claiming works again");
                    claim_failing = false;
                }
                jobs
            }
            Err(error) => {
                // Never read a database error as "no job": say so, back off, retry.
                if !claim_failing {
                    tracing::warn!(error = %error, "claiming jobs failed; retrying");
                    claim_failing = true;
                }
                metrics::counter!("outbox_claim_errors_total").increment(1);
                drop(permits);
                if wait(
                    &shared,
                    &shutdown,
                    settings.poll_interval.min(Duration::from_secs(1)),
                )
                .await
                {
                    return;
                }
                continue;
            }
        };

        if shutdown.is_cancelled() && !jobs.is_empty() {
            // Claimed while shutdown was asked for: hand them back untouched.
            release(&shared, &jobs).await;
            return;
        }

        let got = jobs.len();
        metrics::histogram!("outbox_claim_batch_size").record(got as f64);
        RelayStats::add(&shared.stats.claims, 1);
        RelayStats::add(&shared.stats.claimed, got as u64);
        start(&shared, jobs, &mut permits, &completions, &interrupt);
        drop(permits); // slots we asked for but found no job for

        if got < wanted {
            // The queue has nothing more due for us: sleep until a NOTIFY or the poll.
            if wait(&shared, &shutdown, settings.poll_interval).await {
                return;
            }
        }
    }
}

async fn claim(shared: &Arc<Shared>, limit: usize) -> Result<Vec<ClaimedJob>, crate::db::DbError> {
    let shared = Arc::clone(shared);
    let pool = shared.pool.clone();
    run_blocking(&pool, move |conn| {
        let settings = &shared.settings;
        let jobs = claim_jobs(
            conn,
            &ClaimRequest {
                worker_id: &settings.worker_id,
                kinds: &settings.kinds,
                limit: i64::try_from(limit).unwrap_or(i64::MAX),
                lease: settings.lease,
            },
        )?;
        // Registered before the claim's connection is released, so the
        // heartbeat covers each job from its first moment.
        let mut in_flight = shared.in_flight();
        for job in &jobs {
            in_flight.insert(
                job.id,
                InFlight {
                    attempt: job.attempt,
                    kind: job.kind.clone(),
                },
            );
        }
        Ok(jobs)
    })
    .await
}

fn start(
    shared: &Arc<Shared>,
    jobs: Vec<ClaimedJob>,
    permits: &mut Vec<OwnedSemaphorePermit>,
    completions: &mpsc::Sender<Finish>,
    interrupt: &CancellationToken,
) {
    for job in jobs {
        metrics::counter!("outbox_jobs_claimed_total", "kind" => job.kind.clone()).increment(1);
        let Some(permit) = permits.pop() else {
            // Cannot happen: the claim asked for permits.len() jobs at most.
            tracing::error!(job_id = job.id, "claimed more jobs than free slots");
            break;
        };
        tokio::spawn(executor::run(
            Arc::clone(shared),
            job,
            permit,
            completions.clone(),
            interrupt.clone(),
        ));
    }
}

/// Returns claimed-but-unstarted jobs to `pending` without spending an attempt.
async fn release(shared: &Arc<Shared>, jobs: &[ClaimedJob]) {
    let leases: Vec<JobLease> = jobs
        .iter()
        .map(|j| JobLease {
            job_id: j.id,
            attempt: j.attempt,
        })
        .collect();
    let worker = shared.settings.worker_id.clone();
    let to_release = leases.clone();
    match run_blocking(&shared.pool, move |conn| {
        Ok(release_jobs(conn, &worker, &to_release)?)
    })
    .await
    {
        Ok(released) => {
            RelayStats::add(&shared.stats.released, released.len() as u64);
            tracing::info!(
                released = released.len(),
                "released unstarted jobs at shutdown"
            );
        }
        Err(error) => tracing::warn!(
            error = %error,
            jobs = leases.len(),
            "could not release unstarted jobs; the reaper will requeue them when their lease expires"
        ),
    }
    let mut in_flight = shared.in_flight();
    for lease in &leases {
        in_flight.remove(&lease.job_id);
    }
}

/// Sleeps until woken, the timeout, or shutdown; true on shutdown.
async fn wait(shared: &Shared, shutdown: &CancellationToken, timeout: Duration) -> bool {
    tokio::select! {
        () = shutdown.cancelled() => true,
        () = shared.wake.notified() => false,
        () = tokio::time::sleep(timeout) => false,
    }
}
