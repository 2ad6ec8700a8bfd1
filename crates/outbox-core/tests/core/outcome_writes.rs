//! Writes that ride with an attempt's outcome, whatever it is
//! (`JobContext::write_with_outcome`): committed in the transaction that
//! records the outcome, on the relay's own connection when the write hands
//! over its row and through Diesel when it does not, and never for a claim
//! the fenced finish did not match.

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Integer, Jsonb};
use outbox_core::outbox::{CommitHook, Enqueuer, HookRow, JobOptions, LocalWrite};
use outbox_core::statements::{
    ClaimedJob, Finish, HookStatements, HotStatements, Outcome, ReapRequest, reap_expired_leases,
};
use outbox_core::worker::{EffectError, EffectResult, JobArgs, JobContext, Worker, Workers};
use serde::{Deserialize, Serialize};

use crate::support::{TestDb, count, settings, spawn_relay, wait_until};

const MINUTE: Duration = Duration::from_secs(60);

/// Writes one row of `notes` per `(job_id, attempt)` of `$1`.
const NOTE_SQL: &str = "INSERT INTO notes (job_id, attempt) \
     SELECT job_id, attempt FROM jsonb_to_recordset($1) AS r(job_id bigint, attempt integer)";

/// Prepares, then is refused when it runs, inside the finish's transaction:
/// a note without its attempt.
const BROKEN_SQL: &str = "INSERT INTO notes (job_id, attempt) \
     SELECT job_id, NULL FROM jsonb_to_recordset($1) AS r(job_id bigint)";

fn notes_table(conn: &mut PgConnection) {
    diesel::sql_query("CREATE TABLE notes (job_id bigint NOT NULL, attempt integer NOT NULL)")
        .execute(conn)
        .expect("create notes");
}

/// `(job_id, attempt)` of every note, sorted.
fn notes(conn: &mut PgConnection) -> Vec<(i64, i32)> {
    #[derive(QueryableByName)]
    struct Note {
        #[diesel(sql_type = BigInt)]
        job_id: i64,
        #[diesel(sql_type = Integer)]
        attempt: i32,
    }
    diesel::sql_query("SELECT job_id, attempt FROM notes ORDER BY job_id, attempt")
        .load::<Note>(conn)
        .expect("notes")
        .into_iter()
        .map(|n| (n.job_id, n.attempt))
        .collect()
}

/// A note of one attempt; `as_row`: handed over as a row (the relay's own
/// connection), else written by `apply` (Diesel).
struct Note {
    job_id: i64,
    attempt: i32,
    as_row: bool,
    statement: &'static str,
}

impl CommitHook for Note {
    fn apply(&self, conn: &mut PgConnection) -> QueryResult<()> {
        diesel::sql_query(self.statement)
            .bind::<Jsonb, _>(
                serde_json::json!([{ "job_id": self.job_id, "attempt": self.attempt }]),
            )
            .execute(conn)
            .map(drop)
    }

    fn row(&self) -> Option<HookRow> {
        self.as_row.then(|| HookRow {
            statement: self.statement,
            row: serde_json::json!({ "job_id": self.job_id, "attempt": self.attempt }),
        })
    }

    fn describe(&self) -> String {
        format!("a note of job {}", self.job_id)
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Noted {
    /// `retry_once`, `permanent` or `succeed`.
    then: String,
    as_row: bool,
}

impl JobArgs for Noted {
    const KIND: &'static str = "noted";
}

struct NotingWorker;

impl Worker<Noted> for NotingWorker {
    async fn work(&self, args: Noted, ctx: JobContext) -> EffectResult {
        ctx.write_with_outcome(LocalWrite::new(Note {
            job_id: ctx.id(),
            attempt: ctx.attempt(),
            as_row: args.as_row,
            statement: NOTE_SQL,
        }));
        match args.then.as_str() {
            "retry_once" if ctx.attempt() == 1 => Err(EffectError::retryable("not yet")),
            "permanent" => Err(EffectError::permanent("never")),
            _ => Ok(None),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_outcome_commits_the_writes_of_its_attempt_rows_or_hooks_alike() {
    let db = TestDb::new();
    let mut conn = db.conn();
    notes_table(&mut conn);
    let mut ids = Vec::new();
    for as_row in [true, false] {
        for then in ["retry_once", "permanent", "succeed"] {
            let args = Noted {
                then: then.to_owned(),
                as_row,
            };
            ids.push(
                Enqueuer::new()
                    .enqueue(&mut conn, &args, &JobOptions::default().max_attempts(3))
                    .expect("enqueue"),
            );
        }
    }
    let workers = Workers::new().register::<Noted, _>(NotingWorker);
    let relay = spawn_relay(&db, settings("noting", &workers), workers);
    wait_until("four done and two failed", MINUTE, || {
        count(&mut conn, "done") == 4 && count(&mut conn, "failed") == 2
    })
    .await;
    relay.stop().await;

    // Each attempt's note, the failed and the retried ones too.
    let mut expected = Vec::new();
    for chunk in ids.chunks(3) {
        expected.extend([(chunk[0], 1), (chunk[0], 2), (chunk[1], 1), (chunk[2], 1)]);
    }
    expected.sort_unstable();
    assert_eq!(notes(&mut conn), expected);
}

fn claim(conn: &mut PgConnection, worker: &str) -> ClaimedJob {
    crate::support::claim_one(conn, "noted", worker, MINUTE)
}

fn noted(job: &ClaimedJob, statement: &'static str) -> (usize, HookRow) {
    let row = Note {
        job_id: job.id,
        attempt: job.attempt,
        as_row: true,
        statement,
    }
    .row()
    .expect("a row");
    (0, row)
}

#[tokio::test]
async fn a_zombies_writes_are_never_sent_and_a_refused_write_takes_its_outcome_with_it() {
    let db = TestDb::new();
    let mut conn = db.conn();
    notes_table(&mut conn);
    let args = Noted {
        then: "succeed".to_owned(),
        as_row: true,
    };
    let job = Enqueuer::new()
        .enqueue(&mut conn, &args, &JobOptions::default())
        .expect("enqueue");
    let (client, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .expect("a tokio-postgres connection");
    tokio::spawn(connection);
    let statements = HotStatements::prepare(&client).await.expect("prepare");
    let hooks = HookStatements::default();

    let zombie = claim(&mut conn, "zombie");
    diesel::sql_query(
        "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
    )
    .bind::<BigInt, _>(job)
    .execute(&mut conn)
    .expect("expire the lease");
    reap_expired_leases(&mut conn, &ReapRequest::new(10), |_| Duration::ZERO).expect("reap");
    let owner = claim(&mut conn, "owner");
    let failed = |claim: &ClaimedJob| Finish {
        job_id: job,
        lease_token: claim.lease_token,
        outcome: Outcome::Failed {
            error: "refused".to_owned(),
        },
    };

    let late = statements
        .finish_with_rows(
            &client,
            &hooks,
            &[failed(&zombie)],
            vec![noted(&zombie, NOTE_SQL)],
        )
        .await
        .expect("finish");
    assert_eq!(late.lost, vec![job]);
    assert_eq!(notes(&mut conn), vec![], "the zombie's note is not written");

    let refused = statements
        .finish_with_rows(
            &client,
            &hooks,
            &[failed(&owner)],
            vec![noted(&owner, BROKEN_SQL)],
        )
        .await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(
        count(&mut conn, "processing"),
        1,
        "the outcome rolled back with its refused write"
    );

    // The connection is out of the failed transaction: the owner's outcome
    // and note commit together.
    let current = statements
        .finish_with_rows(
            &client,
            &hooks,
            &[failed(&owner)],
            vec![noted(&owner, NOTE_SQL)],
        )
        .await
        .expect("finish");
    assert_eq!(current.applied, vec![job]);
    assert_eq!(count(&mut conn, "failed"), 1);
    assert_eq!(notes(&mut conn), vec![(job, owner.attempt)]);
}
