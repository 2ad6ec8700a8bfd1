//! `bench --workflow`: jobs that wait for parents.
//!
//! - Release latency: a parent's finish to its dependent's start, against an
//!   idle relay. The bench claims and finishes each parent itself (kind
//!   `wf_parent`, which the relay does not run) and the relay runs the
//!   dependent (`noop`); measured from just before the finish's statement,
//!   as `latency.rs` measures from just before the enqueue (a relay woken by
//!   the commit may start the dependent before the finishing thread reads
//!   the clock again).
//! - Fan-out: one parent, `FAN_OUT` dependents; from just before the
//!   parent's finish to the last dependent done.
//! - Fan-in: `FAN_IN` parents, one dependent; the parents finished in
//!   batches of `FAN_IN_BATCH`, from just before the first finish to the
//!   dependent's start.

use std::time::{Duration, Instant};

use diesel::prelude::*;
use outbox_core::outbox::{Enqueuer, JobOptions, NewJob, Parent};
use outbox_core::statements::{ClaimRequest, ClaimedJob, Finish, Outcome, claim_jobs, finish_jobs};

use super::BenchArgs;
use super::latency::{RecordingRelay, reset};
use super::percentiles::Latency;
use order_service::effects::Noop;

const PARENT_KIND: &str = "wf_parent";
/// Children of the fan-out's one parent.
pub const FAN_OUT: usize = 10_000;
/// Parents of the fan-in's one child.
pub const FAN_IN: usize = 1_000;
const FAN_IN_BATCH: usize = 100;

/// A parent job: the relay under test does not run its kind, the bench
/// claims and finishes it.
fn parent_job(n: usize) -> NewJob {
    NewJob::new(PARENT_KIND, serde_json::json!({ "n": n }))
}

fn enqueue_parent(enqueuer: &Enqueuer, conn: &mut PgConnection, n: usize) -> anyhow::Result<i64> {
    enqueuer
        .enqueue_many(conn, &[parent_job(n)])?
        .pop()
        .ok_or_else(|| anyhow::anyhow!("no id"))
}

/// What `--workflow` measured.
#[derive(Debug, Clone)]
pub struct Workflow {
    pub release: Latency,
    pub fan_out: Duration,
    pub fan_in: Duration,
}

impl Workflow {
    pub fn summary(&self) -> String {
        format!(
            "workflow: release latency (parent's finish to dependent's start, idle relay) \
             p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {} samples; \
             fan-out of {FAN_OUT} children {:.2} s; fan-in of {FAN_IN} parents {:.2} s",
            self.release.p50_ms,
            self.release.p99_ms,
            self.release.max_ms,
            self.release.samples,
            self.fan_out.as_secs_f64(),
            self.fan_in.as_secs_f64(),
        )
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "workflow": {
                "release_samples": self.release.samples,
                "release_p50_ms": self.release.p50_ms,
                "release_p99_ms": self.release.p99_ms,
                "release_max_ms": self.release.max_ms,
                "fan_out_children": FAN_OUT,
                "fan_out_seconds": self.fan_out.as_secs_f64(),
                "fan_in_parents": FAN_IN,
                "fan_in_seconds": self.fan_in.as_secs_f64(),
            }
        })
    }
}

pub async fn measure(url: &str, args: &BenchArgs) -> anyhow::Result<Workflow> {
    reset(url).await?;
    let relay = RecordingRelay::start(url, vec!["noop".to_owned()], args).await?;
    let began = release_samples(url, args).await?;
    let release = relay.latency_of(&began).await?;

    reset(url).await?;
    let relay = RecordingRelay::start(url, vec!["noop".to_owned()], args).await?;
    let fan_out = fan_out(url).await?;
    relay.stop().await?;

    reset(url).await?;
    let relay = RecordingRelay::start(url, vec!["noop".to_owned()], args).await?;
    let (child, began) = fan_in(url).await?;
    let latency = relay.latency_of(&[(child, began)]).await?;
    let fan_in = Duration::from_secs_f64(latency.max_ms / 1000.0);
    Ok(Workflow {
        release,
        fan_out,
        fan_in,
    })
}

fn claim_parents(conn: &mut PgConnection, limit: usize) -> anyhow::Result<Vec<ClaimedJob>> {
    let kinds = vec![PARENT_KIND.to_owned()];
    Ok(claim_jobs(
        conn,
        &ClaimRequest {
            worker_id: "bench-workflow",
            kinds: &kinds,
            limit: i64::try_from(limit)?,
            lease: Duration::from_secs(600),
        },
    )?)
}

fn done(job: &ClaimedJob) -> Finish {
    Finish {
        job_id: job.id,
        lease_token: job.lease_token,
        outcome: Outcome::Done { local: None },
    }
}

/// `args.latency_samples` pairs, one at a time, `args.latency_interval`
/// apart: each dependent's id with the moment just before its parent's
/// finish.
async fn release_samples(url: &str, args: &BenchArgs) -> anyhow::Result<Vec<(i64, Instant)>> {
    let samples = args.latency_samples;
    let interval = args.latency_interval;
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<(i64, Instant)>> {
        let mut conn = PgConnection::establish(&url)?;
        let enqueuer = Enqueuer::new();
        let mut began_at = Vec::with_capacity(samples);
        for n in 0..samples {
            let parent = enqueue_parent(&enqueuer, &mut conn, n)?;
            let child = enqueuer.enqueue(
                &mut conn,
                &Noop(serde_json::json!({ "sample": n })),
                &JobOptions::default().depends_on([parent]),
            )?;
            let claimed = claim_parents(&mut conn, 1)?;
            anyhow::ensure!(claimed.len() == 1, "the parent was not claimed");
            let began = Instant::now();
            let report = finish_jobs(&mut conn, &[done(&claimed[0])])?;
            anyhow::ensure!(
                report.released == 1,
                "the finish released {}",
                report.released
            );
            began_at.push((child, began));
            std::thread::sleep(interval);
        }
        Ok(began_at)
    })
    .await?
}

/// One parent with `FAN_OUT` children: from just before the parent's finish
/// to the last child done.
async fn fan_out(url: &str) -> anyhow::Result<Duration> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<Duration> {
        let mut conn = PgConnection::establish(&url)?;
        let enqueuer = Enqueuer::new();
        let parent = enqueue_parent(&enqueuer, &mut conn, 0)?;
        let children: Vec<NewJob> = (0..FAN_OUT)
            .map(|n| {
                NewJob::for_args(
                    &Noop(serde_json::json!({ "child": n })),
                    &JobOptions::default().depends_on([parent]),
                )
            })
            .collect::<Result<_, _>>()?;
        for chunk in children.chunks(1000) {
            enqueuer.enqueue_many(&mut conn, chunk)?;
        }
        let claimed = claim_parents(&mut conn, 1)?;
        anyhow::ensure!(claimed.len() == 1, "the parent was not claimed");
        let began = Instant::now();
        let report = finish_jobs(&mut conn, &[done(&claimed[0])])?;
        anyhow::ensure!(report.released == FAN_OUT, "released {}", report.released);
        let deadline = began + Duration::from_secs(600);
        loop {
            let finished: i64 =
                diesel::sql_query("SELECT count(*) AS n FROM jobs_done WHERE kind = 'noop'")
                    .get_result::<Count>(&mut conn)?
                    .n;
            if finished >= i64::try_from(FAN_OUT)? {
                return Ok(began.elapsed());
            }
            anyhow::ensure!(Instant::now() < deadline, "only {finished} children done");
            std::thread::sleep(Duration::from_millis(5));
        }
    })
    .await?
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// `FAN_IN` parents of one child, finished `FAN_IN_BATCH` a statement:
/// the child's id and the moment just before the first finish.
async fn fan_in(url: &str) -> anyhow::Result<(i64, Instant)> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<(i64, Instant)> {
        let mut conn = PgConnection::establish(&url)?;
        let enqueuer = Enqueuer::new();
        let mut jobs: Vec<NewJob> = (0..FAN_IN).map(parent_job).collect();
        jobs.push(NewJob::for_args(
            &Noop(serde_json::json!({ "fan_in": FAN_IN })),
            &JobOptions::default().depends_on((0..FAN_IN).map(Parent::InBatch)),
        )?);
        let ids = enqueuer.enqueue_many(&mut conn, &jobs)?;
        let child = *ids.last().ok_or_else(|| anyhow::anyhow!("no ids"))?;
        let parents = claim_parents(&mut conn, FAN_IN)?;
        anyhow::ensure!(parents.len() == FAN_IN, "claimed {} parents", parents.len());
        let began = Instant::now();
        let mut released = 0;
        for batch in parents.chunks(FAN_IN_BATCH) {
            let finishes: Vec<Finish> = batch.iter().map(done).collect();
            released += finish_jobs(&mut conn, &finishes)?.released;
        }
        anyhow::ensure!(released == 1, "released {released}");
        Ok((child, began))
    })
    .await?
}
