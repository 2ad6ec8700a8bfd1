//! The model's world in PostgreSQL: one database, the application's
//! connection (enqueue, the clock, reading the rows), one tokio-postgres
//! connection per relay with the relay's prepared statements
//! ([`HotStatements`], the texts passed through a mutation's rewrites), and
//! one thread per receiver holding its transaction open across steps.

use std::sync::mpsc;
use std::time::Duration;

use diesel::connection::{AnsiTransactionManager, TransactionManager as _};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Int4, Nullable, Text};
use outbox_core::outbox::{
    ConcurrencyLimit, DependencyPolicy, Enqueuer, JobOptions, NewJob, Parent, set_concurrency_limit,
};
use outbox_core::statements::{
    ClaimRequest, Finish, FinishReport, HeartbeatReport, HotStatements, JobLease, Outcome,
    ReapReport, ReapRequest,
};

use super::model::{CHILD, HEAD, JOB_NAMES, JOBS, NEXT, Policy, RECEIVERS, RELAYS};
use super::mutations::{Mutation, RECORD_MESSAGE_FILE, rewrite};
use crate::support::TestDb;

pub const ORDERING_KEY: &str = "model-key";
pub const CONCURRENCY_KEY: &str = "model-limit";
const SOURCE: &str = "model";
const MESSAGE: &str = "m1";
/// Long enough never to pass on its own: the walk's clock is the UPDATEs below.
const LEASE: Duration = Duration::from_secs(3600);

pub fn kind(job: usize) -> String {
    format!("model_{}", JOB_NAMES[job])
}

/// One row of `jobs_all`, as the comparison reads it.
#[derive(Debug, QueryableByName)]
pub struct Row {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = Text)]
    pub status: String,
    #[diesel(sql_type = Int4)]
    pub attempts: i32,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub lease_token: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    pub locked_by: Option<String>,
    #[diesel(sql_type = Bool)]
    pub blocked: bool,
    #[diesel(sql_type = Array<BigInt>)]
    pub waiting_on: Vec<i64>,
    #[diesel(sql_type = Nullable<Array<BigInt>>)]
    pub unfinished_parents: Option<Vec<i64>>,
    #[diesel(sql_type = Bool)]
    pub due: bool,
    #[diesel(sql_type = Bool)]
    pub lease_live: bool,
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[derive(QueryableByName)]
struct Inserted {
    #[diesel(sql_type = BigInt)]
    #[allow(dead_code)]
    id: i64,
}

struct RelayConn {
    client: tokio_postgres::Client,
    statements: HotStatements,
}

enum Command {
    /// Opens a transaction and records the message.
    Record,
    /// Applies the message (enqueues `NEXT`) if told to, then commits.
    Commit {
        apply: bool,
    },
    Rollback,
}

/// A receiver: a thread that owns a Diesel connection, since its insert may
/// wait on the other receiver's transaction while the walk goes on.
struct ReceiverConn {
    commands: mpsc::Sender<Command>,
    replies: mpsc::Receiver<Result<bool, String>>,
    pid: i32,
    thread: std::thread::JoinHandle<()>,
}

pub struct Sql {
    rt: tokio::runtime::Runtime,
    app: PgConnection,
    relays: Vec<RelayConn>,
    receivers: Vec<ReceiverConn>,
    /// The dedupe's statement, as the mutation left it.
    record: String,
    policy: Policy,
    /// Dropped last (fields drop in order): the database goes with the value.
    _db: TestDb,
}

impl Sql {
    /// A database of its own, `mutation`'s schema change made and its
    /// rewrites applied to the statements.
    pub fn new(mutation: Option<Mutation>) -> Sql {
        let db = TestDb::new();
        let mut app = db.conn();
        diesel::sql_query("SET synchronous_commit = off")
            .execute(&mut app)
            .expect("session setting");
        for statement in mutation.map_or(&[][..], Mutation::setup) {
            diesel::sql_query(*statement)
                .execute(&mut app)
                .unwrap_or_else(|e| panic!("mutation {mutation:?} does not apply: {e}"));
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let relays = (0..RELAYS)
            .map(|_| {
                rt.block_on(async {
                    let (client, connection) =
                        tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
                            .await
                            .expect("a relay's connection");
                    tokio::spawn(connection);
                    let statements = HotStatements::prepare_rewritten(&client, |file, text| {
                        rewrite(mutation, file, text)
                    })
                    .await
                    .expect("the relay's statements prepare");
                    RelayConn { client, statements }
                })
            })
            .collect();
        let record = rewrite(
            mutation,
            RECORD_MESSAGE_FILE,
            outbox_core::dedupe::RECORD_MESSAGE_SQL,
        );
        Sql {
            rt,
            app,
            relays,
            receivers: Vec::new(),
            record,
            policy: Policy::Hold,
            _db: db,
        }
    }

    /// Empties the tables for the next walk (receivers idle, relays holding
    /// nothing), whose dependent has `policy`.
    pub fn reset(&mut self, policy: Policy) {
        self.policy = policy;
        // New receivers: whatever the last walk left open or waiting (it
        // may have parted from the model anywhere) rolls back as the old
        // ones' connections close.
        let old = std::mem::take(&mut self.receivers);
        let threads: Vec<_> = old.into_iter().map(|r| r.thread).collect();
        for thread in threads {
            let _ = thread.join();
        }
        self.receivers = (0..RECEIVERS)
            .map(|_| ReceiverConn::spawn(&self._db, self.record.clone()))
            .collect();
        for statement in [
            "DELETE FROM jobs",
            "DELETE FROM jobs_done",
            "DELETE FROM job_claims",
            "DELETE FROM inbox_messages",
            "DELETE FROM job_concurrency_keys",
        ] {
            diesel::sql_query(statement)
                .execute(&mut self.app)
                .expect("reset");
        }
        let limit = ConcurrencyLimit {
            max_in_flight: Some(i32::from(super::model::LIMIT)),
            ..ConcurrencyLimit::default()
        };
        set_concurrency_limit(&mut self.app, CONCURRENCY_KEY, &limit).expect("the key's limit");
    }

    fn options(&self, job: usize) -> JobOptions {
        let mut options = JobOptions::default().max_attempts(2);
        if job != CHILD {
            options = options.ordering_key(ORDERING_KEY);
        }
        if job != HEAD {
            options = options.concurrency_key(CONCURRENCY_KEY);
        }
        if job == CHILD {
            options =
                options
                    .depends_on([Parent::InBatch(0)])
                    .dependency_policy(match self.policy {
                        Policy::Hold => DependencyPolicy::Hold,
                        Policy::Run => DependencyPolicy::Run,
                    });
        }
        options
    }

    /// The application's transaction: `HEAD` and `CHILD`, which waits for it.
    pub fn enqueue(&mut self) -> Result<Vec<i64>, String> {
        let jobs = [HEAD, CHILD].map(|job| {
            NewJob::new(kind(job), serde_json::json!({})).with_options(&self.options(job))
        });
        self.app
            .transaction(|conn| Enqueuer::new().enqueue_many(conn, &jobs))
            .map_err(|e| format!("enqueue: {e}"))
    }

    /// A receiver's insert: `Some(first)` when it returned, `None` when it
    /// waits on a lock (checked in `pg_stat_activity`, not by timing).
    pub fn record(&mut self, receiver: usize, wait_expected: bool) -> Result<Option<bool>, String> {
        let r = &self.receivers[receiver];
        r.commands
            .send(Command::Record)
            .map_err(|_| "the receiver's thread is gone".to_owned())?;
        if !wait_expected {
            return r.reply().map(Some);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(reply) = r.replies.try_recv() {
                return reply.map(Some);
            }
            if std::time::Instant::now() > deadline {
                return Err("the insert neither returned nor waited on a lock within 30s".into());
            }
            let waiting: Count = diesel::sql_query(
                "SELECT count(*) AS n FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
            )
            .bind::<Int4, _>(r.pid)
            .get_result(&mut self.app)
            .map_err(|e| e.to_string())?;
            if waiting.n > 0 {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The answer of a receiver's insert that was waiting.
    pub fn recorded(&mut self, receiver: usize) -> Result<bool, String> {
        self.receivers[receiver].reply()
    }

    /// Ends a receiver's transaction: applies the message (enqueues `NEXT`)
    /// when `apply`, and commits; or rolls back.
    pub fn end(&mut self, receiver: usize, commit: bool, apply: bool) -> Result<(), String> {
        let r = &self.receivers[receiver];
        let command = if commit {
            Command::Commit { apply }
        } else {
            Command::Rollback
        };
        r.commands
            .send(command)
            .map_err(|_| "the receiver's thread is gone".to_owned())?;
        r.reply().map(drop)
    }

    pub fn claim(&mut self, relay: usize, limit: i64) -> Result<Vec<(i64, i64)>, String> {
        let kinds: Vec<String> = (0..JOBS).map(kind).collect();
        let worker = worker_id(relay);
        let r = &self.relays[relay];
        let request = ClaimRequest {
            worker_id: &worker,
            kinds: &kinds,
            limit,
            lease: LEASE,
        };
        let claimed = self
            .rt
            .block_on(r.statements.claim(&r.client, &request, None))
            .map_err(|e| pg("claim", &e))?;
        Ok(claimed.iter().map(|j| (j.id, j.lease_token)).collect())
    }

    pub fn heartbeat(
        &mut self,
        relay: usize,
        leases: &[JobLease],
    ) -> Result<HeartbeatReport, String> {
        let r = &self.relays[relay];
        self.rt
            .block_on(r.statements.extend(&r.client, leases, LEASE))
            .map_err(|e| pg("heartbeat", &e))
    }

    /// Every outcome through the standalone finish first, as if its claim
    /// were marked standalone whatever the job: the model's jobs all have a
    /// key or a dependent, so the walk holds the standalone finish's own
    /// checks to the model (the claim's mark only spares it work).
    pub fn finish(&mut self, relay: usize, finish: Finish) -> Result<FinishReport, String> {
        let r = &self.relays[relay];
        self.rt
            .block_on(
                r.statements
                    .finish_standalone_first(&r.client, &[finish], &[true]),
            )
            .map_err(|e| pg("finish", &e))
    }

    pub fn hand_back(&mut self, relay: usize, lease: JobLease) -> Result<Vec<i64>, String> {
        let r = &self.relays[relay];
        self.rt
            .block_on(r.statements.hand_back(&r.client, &[lease]))
            .map_err(|e| pg("hand back", &e))
    }

    pub fn reap(&mut self, relay: usize, spare: &[i64]) -> Result<ReapReport, String> {
        let r = &self.relays[relay];
        let request = ReapRequest {
            limit: 10,
            margin: Duration::ZERO,
            spare,
        };
        self.rt
            .block_on(r.statements.reap(&r.client, &request, |_| LEASE))
            .map_err(|e| pg("reap", &e))
    }

    /// The clock, for one job: its lease runs out, or its backoff ends.
    pub fn lease_runs_out(&mut self, id: i64) -> Result<(), String> {
        self.update(
            "UPDATE jobs SET lease_expires_at = now() - interval '1 hour' WHERE id = $1",
            id,
        )
    }

    pub fn backoff_ends(&mut self, id: i64) -> Result<(), String> {
        self.update(
            "UPDATE jobs SET run_after = now() - interval '1 second' WHERE id = $1",
            id,
        )
    }

    fn update(&mut self, statement: &str, id: i64) -> Result<(), String> {
        match diesel::sql_query(statement)
            .bind::<BigInt, _>(id)
            .execute(&mut self.app)
        {
            Ok(1) => Ok(()),
            Ok(n) => Err(format!("`{statement}` changed {n} rows of job {id}")),
            Err(e) => Err(e.to_string()),
        }
    }

    pub fn rows(&mut self) -> Result<Vec<Row>, String> {
        diesel::sql_query(
            "SELECT id, kind, status, attempts, lease_token, locked_by, blocked, waiting_on,
                    unfinished_parents, run_after <= now() AS due,
                    coalesce(lease_expires_at > now(), false) AS lease_live
             FROM jobs_all ORDER BY id",
        )
        .load(&mut self.app)
        .map_err(|e| e.to_string())
    }

    /// The concurrency key's `in_flight`.
    pub fn in_flight(&mut self) -> Result<i64, String> {
        diesel::sql_query(
            "SELECT coalesce(sum(in_flight), 0)::bigint AS n FROM job_concurrency_keys WHERE key = $1",
        )
        .bind::<Text, _>(CONCURRENCY_KEY)
        .get_result::<Count>(&mut self.app)
        .map(|c| c.n)
        .map_err(|e| e.to_string())
    }

    /// Committed records of the message.
    pub fn records(&mut self) -> Result<i64, String> {
        diesel::sql_query(
            "SELECT count(*) AS n FROM inbox_messages WHERE source = $1 AND message_id = $2",
        )
        .bind::<Text, _>(SOURCE)
        .bind::<Text, _>(MESSAGE)
        .get_result::<Count>(&mut self.app)
        .map(|c| c.n)
        .map_err(|e| e.to_string())
    }
}

/// A tokio-postgres error with the server's message, which its `Display` leaves out.
fn pg(statement: &str, e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{statement}: {} ({})", db.message(), db.code().code()),
        None => format!("{statement}: {e}"),
    }
}

pub fn worker_id(relay: usize) -> String {
    format!("relay-{relay}")
}

impl ReceiverConn {
    fn spawn(db: &TestDb, record: String) -> ReceiverConn {
        let (commands, inbox) = mpsc::channel::<Command>();
        let (outbox, replies) = mpsc::channel();
        let (pid_tx, pid_rx) = mpsc::channel();
        let mut conn = db.conn();
        let next = NewJob::new(kind(NEXT), serde_json::json!({})).with_options(
            &JobOptions::default()
                .max_attempts(2)
                .ordering_key(ORDERING_KEY)
                .concurrency_key(CONCURRENCY_KEY),
        );
        let thread = std::thread::spawn(move || {
            let pid: Count = diesel::sql_query("SELECT pg_backend_pid()::bigint AS n")
                .get_result(&mut conn)
                .expect("the receiver's pid");
            let _ = pid_tx.send(pid.n as i32);
            for command in inbox {
                let reply = match command {
                    Command::Record => AnsiTransactionManager::begin_transaction(&mut conn)
                        .and_then(|()| {
                            diesel::sql_query(&record)
                                .bind::<Text, _>(SOURCE)
                                .bind::<Text, _>(MESSAGE)
                                .load::<Inserted>(&mut conn)
                        })
                        .map(|rows| !rows.is_empty()),
                    Command::Commit { apply } => (if apply {
                        Enqueuer::new()
                            .enqueue_many(&mut conn, std::slice::from_ref(&next))
                            .map(drop)
                    } else {
                        Ok(())
                    })
                    .and_then(|()| AnsiTransactionManager::commit_transaction(&mut conn))
                    .map(|()| true),
                    Command::Rollback => {
                        AnsiTransactionManager::rollback_transaction(&mut conn).map(|()| true)
                    }
                };
                if outbox.send(reply.map_err(|e| e.to_string())).is_err() {
                    return;
                }
            }
        });
        let pid = pid_rx.recv().expect("the receiver starts");
        ReceiverConn {
            commands,
            replies,
            pid,
            thread,
        }
    }

    fn reply(&self) -> Result<bool, String> {
        self.replies
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| "a receiver's statement did not return within 30s".to_owned())?
    }
}

/// A finish of `job`'s claim `token` in the outcome's terms.
pub fn finish_of(id: i64, token: i64, outcome: super::model::Outcome) -> Finish {
    let outcome = match outcome {
        super::model::Outcome::Done => Outcome::Done { local: None },
        super::model::Outcome::Retry => Outcome::Retry {
            delay: LEASE,
            error: "the model's retry".into(),
        },
        super::model::Outcome::Fail => Outcome::Failed {
            error: "the model's failure".into(),
        },
    };
    Finish {
        job_id: id,
        lease_token: token,
        outcome,
    }
}
