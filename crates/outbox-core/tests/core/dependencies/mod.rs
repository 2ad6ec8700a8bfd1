//! Jobs that wait for other jobs: never claimed while waiting, released by
//! the finish of their last parent, the policies for parents that do not
//! finish `done`, fencing, and the enqueue's refusals.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel::prelude::*;
use outbox_core::outbox::{
    DependencyError, DependencyPolicy, Enqueuer, JobOptions, NewJob, Parent, RetrySelection,
    cancel_jobs, retry_failed_jobs,
};
use outbox_core::schema::{jobs, jobs_all};
use outbox_core::statements::{
    ClaimRequest, ClaimedJob, Finish, Outcome, ReapRequest, claim_jobs, finish_jobs,
    reap_expired_leases,
};
use outbox_core::worker::{EffectResult, JobArgs, JobContext, Worker, Workers};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

mod concurrency;
mod fencing;
mod policies;
mod release;
mod wake;

use crate::support::{TestDb, count, settings, spawn_relay, wait_until};

#[derive(Debug, Serialize, Deserialize)]
struct Step {
    n: i64,
}

impl JobArgs for Step {
    const KIND: &'static str = "step";
}

fn claim(conn: &mut PgConnection, limit: i64) -> Vec<ClaimedJob> {
    let kinds = vec![Step::KIND.to_owned()];
    claim_jobs(
        conn,
        &ClaimRequest {
            worker_id: "test",
            kinds: &kinds,
            limit,
            lease: Duration::from_secs(600),
        },
    )
    .expect("claim")
}

fn claim_ids(conn: &mut PgConnection) -> Vec<i64> {
    let mut ids: Vec<i64> = claim(conn, 100).into_iter().map(|j| j.id).collect();
    ids.sort_unstable();
    ids
}

fn finish(conn: &mut PgConnection, job: &ClaimedJob, outcome: Outcome) -> usize {
    let report = finish_jobs(
        conn,
        &[Finish {
            job_id: job.id,
            lease_token: job.lease_token,
            outcome,
        }],
    )
    .expect("finish");
    assert_eq!(report.applied, vec![job.id], "{report:?}");
    report.released
}

fn done() -> Outcome {
    Outcome::Done { local: None }
}

fn failed() -> Outcome {
    Outcome::Failed {
        error: "the receiver said no".into(),
    }
}

fn enqueue(conn: &mut PgConnection, n: i64, options: &JobOptions) -> i64 {
    Enqueuer::new()
        .enqueue(conn, &Step { n }, options)
        .expect("enqueue")
}

fn waiting_on(conn: &mut PgConnection, id: i64) -> Vec<i64> {
    jobs_all::table
        .find(id)
        .select(jobs_all::waiting_on)
        .first(conn)
        .expect("the job")
}

fn status(conn: &mut PgConnection, id: i64) -> (String, Option<String>) {
    jobs_all::table
        .find(id)
        .select((jobs_all::status, jobs_all::last_error))
        .first(conn)
        .expect("the job")
}
