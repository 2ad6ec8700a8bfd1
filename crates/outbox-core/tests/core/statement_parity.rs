//! The relay's statements run two ways: through Diesel (`statements`'s
//! functions, which tests and the outcomes with a local write use) and
//! prepared on tokio-postgres ([`HotStatements`], the relay's own). Both take
//! their SQL from the same files, but each binds the parameters and decodes
//! the rows itself. Here the same walk runs both ways on two databases cloned
//! from one template, one way each, and after every step the answers and the
//! rows must be the same: a parameter bound in another order or type, or a
//! column decoded from the wrong place, shows as a difference. The prepared
//! side finishes as the worker pool does, standalone jobs through
//! `finish_standalone_jobs.sql`: the archive it writes must be the one
//! finish_jobs.sql writes.

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Int4, Nullable, Text};
use outbox_core::outbox::{DependencyPolicy, Enqueuer, JobOptions, NewJob, Parent};
use outbox_core::statements::{
    ClaimPosition, ClaimRequest, ClaimedJob, Finish, HotStatements, JobLease, Outcome, ReapRequest,
    advance_stranded_keys, claim_jobs, claim_jobs_after, extend_leases, finish_jobs,
    hand_back_jobs, reap_expired_leases,
};

use crate::support::{TestDb, leases};

const LEASE: Duration = Duration::from_secs(60);
const WORKER: &str = "parity";

/// What a claim answers, without its timestamps (the two databases' clocks
/// are the same clock read at other instants).
#[derive(Debug, PartialEq, Eq)]
struct Claimed {
    id: i64,
    kind: String,
    payload: serde_json::Value,
    attempt: i32,
    max_attempts: i32,
    lease_token: i64,
    concurrency_key: Option<String>,
    unfinished_parents: Option<Vec<i64>>,
    standalone: bool,
}

impl From<&ClaimedJob> for Claimed {
    fn from(job: &ClaimedJob) -> Claimed {
        Claimed {
            id: job.id,
            kind: job.kind.clone(),
            payload: job.payload.clone(),
            attempt: job.attempt,
            max_attempts: job.max_attempts,
            lease_token: job.lease_token,
            concurrency_key: job.concurrency_key.clone(),
            unfinished_parents: job.unfinished_parents.clone(),
            standalone: job.standalone,
        }
    }
}

/// A row of `jobs_all`, the times reduced to what the statements decide.
#[derive(Debug, PartialEq, Eq, QueryableByName)]
struct Row {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    status: String,
    #[diesel(sql_type = Int4)]
    attempts: i32,
    #[diesel(sql_type = Nullable<BigInt>)]
    lease_token: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    locked_by: Option<String>,
    #[diesel(sql_type = Bool)]
    blocked: bool,
    #[diesel(sql_type = Nullable<Text>)]
    last_error: Option<String>,
    #[diesel(sql_type = Array<BigInt>)]
    waiting_on: Vec<i64>,
    #[diesel(sql_type = Nullable<Array<BigInt>>)]
    unfinished_parents: Option<Vec<i64>>,
    /// Tens of seconds from now to `run_after` (a retry's delay as written)
    /// and to `lease_expires_at` (the lease a claim or heartbeat set):
    /// coarse enough that the instants the two sides ran at do not show.
    #[diesel(sql_type = BigInt)]
    due_in_10s: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    lease_in_10s: Option<i64>,
    #[diesel(sql_type = Bool)]
    finished: bool,
    /// Every other column as it is, so that a column one statement writes
    /// and another forgets (the two finishes each list the archive's)
    /// shows.
    #[diesel(sql_type = diesel::sql_types::Jsonb)]
    rest: serde_json::Value,
}

fn rows(conn: &mut PgConnection) -> Vec<Row> {
    diesel::sql_query(
        "SELECT id, status, attempts, lease_token, locked_by, blocked, last_error, \
                coalesce(waiting_on, '{}') AS waiting_on, unfinished_parents, \
                round(extract(epoch FROM greatest(run_after - now(), interval '0')) / 10)::bigint \
                    AS due_in_10s, \
                round(extract(epoch FROM lease_expires_at - now()) / 10)::bigint AS lease_in_10s, \
                finished_at IS NOT NULL AS finished, \
                to_jsonb(a) - '{run_after,lease_expires_at,locked_at,created_at,finished_at}'::text[] \
                    AS rest \
         FROM jobs_all AS a ORDER BY id",
    )
    .load(conn)
    .expect("the jobs' rows")
}

/// Both databases, the Diesel one and the prepared one.
struct Pair {
    _diesel_db: TestDb,
    _prepared_db: TestDb,
    diesel: PgConnection,
    /// The prepared side's rows are read through Diesel too: one reading.
    prepared_rows: PgConnection,
    client: tokio_postgres::Client,
    statements: HotStatements,
    /// Each side's last claim.
    last: (Vec<ClaimedJob>, Vec<ClaimedJob>),
}

impl Pair {
    async fn new() -> Pair {
        let diesel_db = TestDb::new();
        let prepared_db = TestDb::new();
        let (client, connection) = tokio_postgres::connect(&prepared_db.url, tokio_postgres::NoTls)
            .await
            .expect("a tokio-postgres connection");
        tokio::spawn(connection);
        let statements = HotStatements::prepare(&client)
            .await
            .expect("the statements prepare");
        let mut pair = Pair {
            diesel: diesel_db.conn(),
            prepared_rows: prepared_db.conn(),
            _diesel_db: diesel_db,
            _prepared_db: prepared_db,
            client,
            statements,
            last: (Vec::new(), Vec::new()),
        };
        for conn in [&mut pair.diesel, &mut pair.prepared_rows] {
            enqueue(conn);
        }
        pair.same_rows("after the enqueue");
        pair
    }

    fn same_rows(&mut self, step: &str) {
        let (diesel, prepared) = (rows(&mut self.diesel), rows(&mut self.prepared_rows));
        assert_eq!(diesel, prepared, "the rows differ {step}");
    }

    /// A claim both ways; `after`: each side from where its own last claim
    /// ended (the two databases' jobs were enqueued at other instants).
    async fn claim(&mut self, limit: i64, after: bool) -> Vec<ClaimedJob> {
        let position = |jobs: &[ClaimedJob]| {
            jobs.last().map(|last| ClaimPosition {
                run_after: last.run_after,
                id: last.id,
            })
        };
        let (diesel_after, prepared_after) = if after {
            (position(&self.last.0), position(&self.last.1))
        } else {
            (None, None)
        };
        let kinds = ["parity_a".to_owned(), "parity_b".to_owned()];
        let request = ClaimRequest {
            worker_id: WORKER,
            kinds: &kinds,
            limit,
            lease: LEASE,
        };
        let diesel = match diesel_after {
            None => claim_jobs(&mut self.diesel, &request),
            Some(after) => claim_jobs_after(&mut self.diesel, &request, after),
        }
        .expect("Diesel's claim");
        let prepared = self
            .statements
            .claim(&self.client, &request, prepared_after)
            .await
            .expect("the prepared claim");
        assert_eq!(
            diesel.iter().map(Claimed::from).collect::<Vec<_>>(),
            prepared.iter().map(Claimed::from).collect::<Vec<_>>(),
            "the claims differ"
        );
        self.same_rows("after a claim");
        self.last = (diesel.clone(), prepared);
        diesel
    }
}

/// Keyless jobs of two kinds, an ordering key of three, a concurrency key,
/// and a parent with two children (one under `hold`, one under `run`).
fn enqueue(conn: &mut PgConnection) {
    let enqueuer = Enqueuer::new();
    let mut jobs: Vec<NewJob> = (0..6)
        .map(|i| {
            let kind = if i % 2 == 0 { "parity_a" } else { "parity_b" };
            NewJob::new(kind, serde_json::json!({ "n": i }))
                .with_options(&JobOptions::default().max_attempts(if i == 5 { 1 } else { 3 }))
        })
        .collect();
    for i in 0..3 {
        jobs.push(
            NewJob::new("parity_a", serde_json::json!({ "keyed": i }))
                .with_options(&JobOptions::default().ordering_key("parity-key")),
        );
    }
    jobs.push(
        NewJob::new("parity_b", serde_json::json!({ "limited": true }))
            .with_options(&JobOptions::default().concurrency_key("parity-limit")),
    );
    let parent = jobs.len();
    jobs.push(NewJob::new(
        "parity_a",
        serde_json::json!({ "parent": true }),
    ));
    for policy in [DependencyPolicy::Hold, DependencyPolicy::Run] {
        jobs.push(
            NewJob::new(
                "parity_b",
                serde_json::json!({ "child": format!("{policy:?}") }),
            )
            .with_options(
                &JobOptions::default()
                    .depends_on([Parent::InBatch(parent)])
                    .dependency_policy(policy),
            ),
        );
    }
    enqueuer.enqueue_many(conn, &jobs).expect("enqueued");
}

#[tokio::test]
async fn each_hot_statement_answers_and_writes_the_same_through_diesel_and_prepared() {
    let mut pair = Pair::new().await;

    // A first claim, and one after its position (the relay's cursor).
    let first = pair.claim(4, false).await;
    let second = pair.claim(4, true).await;
    let claimed: Vec<ClaimedJob> = first.into_iter().chain(second).collect();
    assert!(claimed.len() >= 5, "{} claimed", claimed.len());

    // A heartbeat naming every claim and one stale token.
    let mut beat = leases(&claimed);
    beat.push(JobLease {
        job_id: claimed[0].id,
        lease_token: claimed[0].lease_token - 1_000,
    });
    let diesel = extend_leases(&mut pair.diesel, &beat, LEASE).expect("Diesel's heartbeat");
    let prepared = pair
        .statements
        .extend(&pair.client, &beat, LEASE)
        .await
        .expect("the prepared heartbeat");
    assert_eq!(diesel, prepared, "the heartbeats differ");
    pair.same_rows("after a heartbeat");

    // Outcomes of every kind, and one under a stale token.
    let outcome = |i: usize| match i % 4 {
        0 => Outcome::Done { local: None },
        1 => Outcome::Retry {
            delay: Duration::from_secs(30),
            error: format!("attempt {i} timed out\u{7}"),
        },
        2 => Outcome::Failed {
            error: "refused".to_owned(),
        },
        _ => Outcome::Done { local: None },
    };
    let (finished, kept) = claimed.split_at(claimed.len() - 2);
    let mut finishes: Vec<Finish> = finished
        .iter()
        .enumerate()
        .map(|(i, job)| Finish {
            job_id: job.id,
            lease_token: job.lease_token,
            outcome: outcome(i),
        })
        .collect();
    finishes.push(Finish {
        job_id: kept[0].id,
        lease_token: kept[0].lease_token + 1_000,
        outcome: Outcome::Done { local: None },
    });
    // The prepared side finishes as the worker pool does: the claims marked
    // standalone through the standalone finish first (the stale token's too).
    let marks: Vec<bool> = finishes
        .iter()
        .map(|f| claimed.iter().any(|j| j.id == f.job_id && j.standalone))
        .collect();
    assert!(
        finishes
            .iter()
            .zip(&marks)
            .any(|(f, &marked)| marked && matches!(f.outcome, Outcome::Done { .. })),
        "no done outcome takes the standalone finish"
    );
    let diesel = finish_jobs(&mut pair.diesel, &finishes).expect("Diesel's finish");
    let prepared = pair
        .statements
        .finish_standalone_first(&pair.client, &finishes, &marks)
        .await
        .expect("the prepared finish");
    assert_eq!(diesel, prepared, "the finishes differ");
    assert!(
        !diesel.applied.is_empty() && !diesel.lost.is_empty(),
        "{diesel:?}"
    );
    pair.same_rows("after the outcomes");

    // The last two handed back, as at shutdown.
    let back = leases(kept);
    let diesel = hand_back_jobs(&mut pair.diesel, &back).expect("Diesel's hand-back");
    let prepared = pair
        .statements
        .hand_back(&pair.client, &back)
        .await
        .expect("the prepared hand-back");
    assert_eq!(diesel, prepared, "the hand-backs differ");
    pair.same_rows("after the hand-back");

    // Claimed again, the leases run out, and the reaper takes them: one
    // requeued, one on its last attempt failed.
    let again = pair.claim(16, false).await;
    assert!(!again.is_empty());
    for conn in [&mut pair.diesel, &mut pair.prepared_rows] {
        diesel::sql_query(
            "UPDATE jobs SET lease_expires_at = now() - interval '1 hour' \
             WHERE status = 'processing'",
        )
        .execute(conn)
        .expect("the leases run out");
    }
    let spare = [again[0].lease_token];
    let request = ReapRequest {
        limit: 100,
        margin: Duration::from_secs(1),
        spare: &spare,
    };
    let delay = |attempt: i32| Duration::from_secs(10 * u64::try_from(attempt).unwrap_or(1));
    let diesel = reap_expired_leases(&mut pair.diesel, &request, delay).expect("Diesel's reap");
    let prepared = pair
        .statements
        .reap(&pair.client, &request, delay)
        .await
        .expect("the prepared reap");
    assert_eq!(
        (diesel.requeued, diesel.failed, diesel.next_due),
        (prepared.requeued, prepared.failed, prepared.next_due),
        "the reaps differ"
    );
    assert!(diesel.requeued + diesel.failed > 0, "{diesel:?}");
    pair.same_rows("after the reap");

    // A key whose head ended outside the finish (an operator's cancel),
    // swept forward by the stranded-key pass.
    for conn in [&mut pair.diesel, &mut pair.prepared_rows] {
        diesel::sql_query(
            "UPDATE jobs SET status = 'cancelled', finished_at = now() \
             WHERE id = (SELECT min(id) FROM jobs \
                         WHERE ordering_key = 'parity-key' AND status <> 'done')",
        )
        .execute(conn)
        .expect("the key's head cancelled");
    }
    let diesel = advance_stranded_keys(&mut pair.diesel, 10).expect("Diesel's sweep");
    let prepared = pair
        .statements
        .advance_stranded(&pair.client, 10)
        .await
        .expect("the prepared sweep");
    assert_eq!(diesel, prepared, "the stranded-key sweeps differ");
    pair.same_rows("after the sweep");
}
