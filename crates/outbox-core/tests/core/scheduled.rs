//! Scheduled jobs: due at their time, not before, and cancelled through the
//! `Enqueuer` inside the transaction that made them pointless.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use outbox_core::outbox::{CancelOutcome, Enqueuer, JobOptions, JobStatus};
use outbox_core::schema::jobs_all;
use outbox_core::statements::{ClaimRequest, Finish, Outcome, claim_jobs, finish_jobs};
use outbox_core::worker::{EffectResult, JobArgs, JobContext, Worker, Workers};
use serde::{Deserialize, Serialize};

use crate::support::{TestDb, settings, spawn_relay, wait_until};

#[derive(Debug, Serialize, Deserialize)]
struct Remind {
    account: i64,
}

impl JobArgs for Remind {
    const KIND: &'static str = "remind";
}

/// A job's id and when its work started.
type Start = (i64, DateTime<Utc>);

/// When each job it performed started.
#[derive(Clone, Default)]
struct Started(Arc<Mutex<Vec<Start>>>);

impl Worker<Remind> for Started {
    async fn work(&self, _args: Remind, ctx: JobContext) -> EffectResult {
        self.0.lock().expect("started").push((ctx.id(), Utc::now()));
        Ok(None)
    }
}

fn status_of(conn: &mut PgConnection, id: i64) -> String {
    jobs_all::table
        .filter(jobs_all::id.eq(id))
        .select(jobs_all::status)
        .first(conn)
        .expect("the job")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_job_does_not_run_before_its_time() {
    let db = TestDb::new();
    let started = Started::default();
    let workers = Workers::new().register::<Remind, _>(started.clone());
    let relay = spawn_relay(&db, settings("scheduler", &workers), workers);
    let mut conn = db.conn();
    let at = Utc::now() + chrono::Duration::milliseconds(800);
    let id = Enqueuer::new()
        .enqueue(
            &mut conn,
            &Remind { account: 1 },
            &JobOptions::default().run_after(at),
        )
        .expect("enqueue");

    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(started.0.lock().expect("started").is_empty(), "ran early");
    wait_until("the job ran", Duration::from_secs(10), || {
        !started.0.lock().expect("started").is_empty()
    })
    .await;
    relay.stop().await;

    let ran = started.0.lock().expect("started").clone();
    assert_eq!(ran.len(), 1);
    assert_eq!(ran[0].0, id);
    assert!(ran[0].1 >= at, "started at {} before {at}", ran[0].1);
}

#[test]
fn a_cancel_in_a_rolled_back_transaction_cancels_nothing_and_in_a_committed_one_cancels() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let enqueuer = Enqueuer::new();
    let later = Utc::now() + chrono::Duration::hours(1);
    let id = enqueuer
        .enqueue(
            &mut conn,
            &Remind { account: 7 },
            &JobOptions::default().run_after(later),
        )
        .expect("enqueue");

    let rolled_back = conn.transaction(|conn| -> QueryResult<()> {
        assert_eq!(enqueuer.cancel(conn, id)?, CancelOutcome::Cancelled);
        // ... the renewal's own write fails after it ...
        Err(diesel::result::Error::RollbackTransaction)
    });
    assert!(rolled_back.is_err());
    assert_eq!(status_of(&mut conn, id), "pending", "still scheduled");

    let outcome = conn
        .transaction(|conn| enqueuer.cancel(conn, id))
        .expect("cancel");
    assert_eq!(outcome, CancelOutcome::Cancelled);
    assert_eq!(status_of(&mut conn, id), "cancelled");

    // A second cancel changes nothing and says why.
    let again = enqueuer.cancel(&mut conn, id).expect("cancel");
    assert_eq!(again, CancelOutcome::Finished(JobStatus::Cancelled));
    assert_eq!(
        enqueuer.cancel(&mut conn, id + 1_000).expect("cancel"),
        CancelOutcome::NotFound
    );
}

#[test]
fn cancelling_a_claimed_or_done_job_changes_nothing_and_says_so() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let enqueuer = Enqueuer::new();
    let id = enqueuer
        .enqueue(&mut conn, &Remind { account: 9 }, &JobOptions::default())
        .expect("enqueue");
    let kinds = vec![Remind::KIND.to_owned()];
    let claim = claim_jobs(
        &mut conn,
        &ClaimRequest {
            worker_id: "relay",
            kinds: &kinds,
            limit: 1,
            lease: Duration::from_secs(60),
        },
    )
    .expect("claim")
    .pop()
    .expect("the job");

    let outcome = conn
        .transaction(|conn| enqueuer.cancel(conn, id))
        .expect("cancel");
    assert_eq!(outcome, CancelOutcome::Claimed);
    assert_eq!(status_of(&mut conn, id), "processing");

    let report = finish_jobs(
        &mut conn,
        &[Finish {
            job_id: id,
            lease_token: claim.lease_token,
            outcome: Outcome::Done { local: None },
        }],
    )
    .expect("finish");
    assert_eq!(report.applied, vec![id], "the claim was untouched");
    assert_eq!(
        enqueuer.cancel(&mut conn, id).expect("cancel"),
        CancelOutcome::Finished(JobStatus::Done)
    );
    assert_eq!(status_of(&mut conn, id), "done");
}
