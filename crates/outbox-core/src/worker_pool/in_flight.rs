//! The claims a worker pool holds, keyed by their fencing token.
//!
//! Each claim is registered as it is made and owned, from then on, by one
//! [`Claim`] guard: the producer hands it to the runner, the runner to the
//! completer, and dropping it, wherever that happens (outcome written, job
//! released, effect abandoned after a lost lease, a panic), removes exactly
//! that claim's entry. Keying by token rather than job id matters when a worker pool
//! holds two attempts of one job (it was cut off longer than the lease, the job
//! was reaped and it claimed the job again): the old attempt's exit can never
//! remove the new attempt's entry and so stop its heartbeat.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio_util::sync::CancellationToken;

use crate::statements::ClaimedJob;
use crate::statements::JobLease;

#[derive(Debug)]
struct Entry {
    job_id: i64,
    /// Cancelled when the heartbeat finds the lease lost.
    lost: CancellationToken,
}

/// Hashes a fencing token by one multiplication. The tokens come from our
/// own sequence, not from anyone who could choose colliding ones, and every
/// job passes through the map twice: SipHash, the default, was a visible
/// share of a drain's CPU. Fibonacci hashing spreads consecutive tokens over
/// the high bits the map's probe reads.
#[derive(Debug, Default)]
struct TokenHasher(u64);

impl Hasher for TokenHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_i64(&mut self, token: i64) {
        self.0 = (token as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// The entries by fencing token.
type Entries = HashMap<i64, Entry, BuildHasherDefault<TokenHasher>>;

/// Every claim this worker pool holds, from the claim until its outcome is written.
#[derive(Debug, Default)]
pub(super) struct Registry {
    entries: Mutex<Entries>,
}

impl Registry {
    fn entries(&self) -> MutexGuard<'_, Entries> {
        // Every critical section is a single insert, remove or read, so a
        // panic elsewhere cannot leave the map half-updated.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers every job of one claim under one lock, in order; each entry
    /// lives as long as its job's guard. One lock a claim: a claim of 256
    /// jobs took it 256 times against the runners' removals.
    pub(super) fn register_all(
        self: &Arc<Self>,
        jobs: Vec<ClaimedJob>,
    ) -> Vec<(ClaimedJob, Claim)> {
        let mut entries = self.entries();
        entries.reserve(jobs.len());
        jobs.into_iter()
            .map(|job| {
                let claim = self.enter(&mut entries, &job);
                (job, claim)
            })
            .collect()
    }

    fn enter(self: &Arc<Self>, entries: &mut Entries, job: &ClaimedJob) -> Claim {
        let lost = CancellationToken::new();
        entries.insert(
            job.lease_token,
            Entry {
                job_id: job.id,
                lost: lost.clone(),
            },
        );
        Claim {
            registry: Arc::clone(self),
            lease: JobLease {
                job_id: job.id,
                lease_token: job.lease_token,
            },
            lost,
        }
    }

    /// Every claim held, in job-id order (the order the completer locks rows in).
    pub(super) fn leases(&self) -> Vec<JobLease> {
        let mut leases: Vec<JobLease> = self
            .entries()
            .iter()
            .map(|(token, entry)| JobLease {
                job_id: entry.job_id,
                lease_token: *token,
            })
            .collect();
        leases.sort_unstable_by_key(|l| (l.job_id, l.lease_token));
        leases
    }

    /// The fencing tokens of every claim held.
    pub(super) fn tokens(&self) -> Vec<i64> {
        self.entries().keys().copied().collect()
    }

    pub(super) fn len(&self) -> usize {
        self.entries().len()
    }

    /// Tells the effect running under `token` that its lease is gone. False if
    /// the claim had already ended (its outcome was just written).
    pub(super) fn lose(&self, token: i64) -> bool {
        match self.entries().get(&token) {
            Some(entry) => {
                entry.lost.cancel();
                true
            }
            None => false,
        }
    }
}

/// One held claim. Dropping it ends the claim's registration.
#[derive(Debug)]
pub(super) struct Claim {
    registry: Arc<Registry>,
    pub lease: JobLease,
    lost: CancellationToken,
}

impl Claim {
    /// Cancelled once the heartbeat has found this claim's lease lost. The
    /// runner also cancels it when it takes the attempt away (its deadline,
    /// shutdown), as the effect's own token: nothing reads it after that but
    /// the effect.
    pub(super) fn lost(&self) -> &CancellationToken {
        &self.lost
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.registry.entries().remove(&self.lease.lease_token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: i64, lease_token: i64) -> ClaimedJob {
        ClaimedJob {
            id,
            kind: "noop".to_owned(),
            payload: serde_json::json!({}),
            attempt: 1,
            max_attempts: 8,
            lease_token,
            created_at: chrono::Utc::now(),
            trace_context: None,
            run_after: chrono::Utc::now(),
            concurrency_key: None,
            unfinished_parents: None,
            standalone: true,
        }
    }

    fn one(registry: &Arc<Registry>, job: ClaimedJob) -> Claim {
        let mut claims = registry.register_all(vec![job]);
        claims
            .pop()
            .map(|(_, claim)| claim)
            .expect("one job, one claim")
    }

    #[test]
    fn the_end_of_an_old_attempt_leaves_a_new_attempt_of_the_same_job_registered() {
        let registry = Arc::new(Registry::default());
        let old = one(&registry, job(7, 100));
        let new = one(&registry, job(7, 205));
        assert_eq!(registry.len(), 2);

        drop(old);
        assert_eq!(
            registry.leases(),
            vec![JobLease {
                job_id: 7,
                lease_token: 205
            }]
        );
        assert!(registry.lose(205));
        assert!(new.lost().is_cancelled());
        drop(new);
        assert_eq!(registry.len(), 0);
        assert!(!registry.lose(205), "an ended claim cannot be lost");
    }

    #[test]
    fn a_claim_dropped_in_a_panicking_task_is_still_unregistered() {
        let registry = Arc::new(Registry::default());
        let claim = one(&registry, job(1, 1));
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _held = claim;
            panic!("effect blew up");
        }));
        assert!(result.is_err());
        assert_eq!(registry.len(), 0);
    }
}
