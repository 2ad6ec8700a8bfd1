//! Where a job is fenced. Every claim draws a fresh `lease_token` from the
//! sequence `jobs_lease_token_seq` (it only ever grows), and every statement
//! that writes a `processing` job names the token its claim drew: it changes
//! the row only while `status = 'processing' AND id = … AND lease_token = …`
//! still holds. A worker whose lease expired and was reaped, or whose job was
//! claimed again, holds a stale token, so its late heartbeat, finish or
//! release matches no row: it changes nothing (not the job, not its ordering
//! key, not its concurrency slot) and is told its lease is lost.
//!
//! The guarded statements, each in `sql/`: `finish_jobs.sql` (done, retry,
//! failed, and what a finish releases), `extend_leases.sql` (the heartbeat),
//! `hand_back_jobs.sql` (unstarted jobs at shutdown) and `update_reaped_jobs.sql`
//! (the reaper, which fences on the token it read under `FOR UPDATE`).

/// A claim a worker holds: the job and the fencing token the claim drew.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct JobLease {
    /// The claimed job.
    pub job_id: i64,
    /// The fencing token the claim drew
    /// ([`ClaimedJob::lease_token`](crate::statements::ClaimedJob::lease_token)): a write
    /// with it changes the job only while it is still `processing` under it.
    pub lease_token: i64,
}
