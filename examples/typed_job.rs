//! A job kind of your own, end to end, with nothing but `outbox_core`: the
//! job type, its worker, a relay that runs it, and the enqueue inside your
//! own Diesel transaction.
//!
//! ```sh
//! createdb -h 127.0.0.1 -U postgres outbox_example
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/outbox_example \
//!     cargo run --example typed_job
//! ```
//!
//! It migrates the database (the queue's tables only), creates two tables of
//! its own (`signups`, and `welcome_log`, which the worker writes), signs a
//! user up and enqueues their welcome message in the same transaction, runs
//! a relay until the job is done, and prints what happened.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use diesel::connection::SimpleConnection as _;
use diesel::prelude::*;
use outbox_core::outbox::{CommitHook, Enqueuer, JobOptions, LocalWrite};
use outbox_core::schema::jobs_all;
use outbox_core::worker::{EffectError, EffectResult, JobArgs, JobContext, Worker, Workers};
use outbox_core::worker_pool::{PoolSettings, WorkerPool};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

// Your application's tables.
diesel::table! {
    signups (id) {
        id -> BigInt,
        email -> Text,
    }
}

diesel::table! {
    welcome_log (signup_id) {
        signup_id -> BigInt,
        job_id -> BigInt,
    }
}

/// Step 1, the job type: its kind and its arguments, in one definition.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WelcomeMessage {
    pub signup_id: i64,
    pub email: String,
}

impl JobArgs for WelcomeMessage {
    const KIND: &'static str = "welcome_message";
}

/// Step 2, its worker. Here it "sends" by logging, and records the send in
/// `welcome_log` through a [`LocalWrite`], which commits in the same
/// transaction as the job's completion: exactly once, even if the relay
/// crashes between the send and the completion, or a zombie worker finishes
/// late.
#[derive(Debug)]
pub struct Welcomer;

impl Worker<WelcomeMessage> for Welcomer {
    async fn work(&self, args: WelcomeMessage, ctx: JobContext) -> EffectResult {
        if !args.email.contains('@') {
            // Retrying cannot mend this: the job goes straight to `failed`.
            return Err(EffectError::permanent(format!(
                "{:?} is not an email address",
                args.email
            )));
        }
        println!(
            "  worker: welcoming {} (job {}, attempt {} of {})",
            args.email,
            ctx.id(),
            ctx.attempt(),
            ctx.max_attempts()
        );
        Ok(Some(LocalWrite::new(RecordWelcome {
            signup_id: args.signup_id,
            job_id: ctx.id(),
        })))
    }
}

/// The write a successful attempt commits with its completion.
struct RecordWelcome {
    signup_id: i64,
    job_id: i64,
}

impl CommitHook for RecordWelcome {
    fn apply(&self, conn: &mut PgConnection) -> QueryResult<()> {
        diesel::insert_into(welcome_log::table)
            .values((
                welcome_log::signup_id.eq(self.signup_id),
                welcome_log::job_id.eq(self.job_id),
            ))
            .on_conflict_do_nothing()
            .execute(conn)
            .map(drop)
    }

    fn describe(&self) -> String {
        format!("welcome_log row for signup {}", self.signup_id)
    }
}

/// What [`run`] did, for the caller (and the test that runs this example).
#[derive(Debug)]
pub struct Report {
    pub job_id: i64,
    pub status: String,
    pub welcomes: i64,
}

/// Steps 3 and 4: enqueue inside your transaction, run a relay until it is done.
pub async fn run(database_url: &str) -> anyhow::Result<Report> {
    let url = database_url.to_owned();
    let mut conn = tokio::task::spawn_blocking(move || -> anyhow::Result<PgConnection> {
        let mut conn = outbox_core::db::establish(&url)?;
        outbox_core::db::run_migrations(&mut conn)?;
        conn.batch_execute(
            "CREATE TABLE IF NOT EXISTS signups (id bigserial PRIMARY KEY, email text NOT NULL);
             CREATE TABLE IF NOT EXISTS welcome_log (
                 signup_id bigint PRIMARY KEY REFERENCES signups (id), job_id bigint NOT NULL);",
        )?;
        Ok(conn)
    })
    .await??;

    // Your write and its job commit together, or neither does.
    let enqueuer = Enqueuer::new(); // built once, kept in your application's state
    let job_id = conn.transaction(|conn| -> QueryResult<i64> {
        let signup_id: i64 = diesel::insert_into(signups::table)
            .values(signups::email.eq("ada@example.com"))
            .returning(signups::id)
            .get_result(conn)?;
        let args = WelcomeMessage {
            signup_id,
            email: "ada@example.com".to_owned(),
        };
        // Options sit next to the arguments: attempts, a start time, and an
        // ordering key (a user's messages go out one at a time, in order).
        let options = JobOptions::default()
            .max_attempts(5)
            .ordering_key(format!("signup-{signup_id}"));
        enqueuer.enqueue(conn, &args, &options)
    })?;
    println!("enqueued {} job {job_id}", WelcomeMessage::KIND);

    // The relay runs the registry's workers and claims only their kinds.
    let workers = Workers::new().register::<WelcomeMessage, _>(Welcomer);
    let kinds = workers.kinds().iter().map(|k| (*k).to_owned()).collect();
    let mut settings = PoolSettings::new("typed-job-example", kinds);
    settings.poll_interval = Duration::from_millis(100);
    let pool = outbox_core::db::build_pool(database_url, &Default::default());
    let relay = WorkerPool::new(pool, database_url.to_owned(), settings, Arc::new(workers))?;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(relay.run_until_stopped(shutdown.clone()));

    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        let status: String = jobs_all::table
            .filter(jobs_all::id.eq(job_id))
            .select(jobs_all::status)
            .get_result(&mut conn)?;
        if status == "done" || status == "failed" {
            break status;
        }
        if Instant::now() > deadline {
            bail!("job {job_id} still {status} after 30s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    shutdown.cancel();
    running.await.context("the relay task")?;

    let welcomes: i64 = welcome_log::table
        .filter(welcome_log::job_id.eq(job_id))
        .count()
        .get_result(&mut conn)?;
    println!("job {job_id} is {status}; welcome_log rows for it: {welcomes}");
    Ok(Report {
        job_id,
        status,
        welcomes,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("DATABASE_URL").context("set DATABASE_URL to a PostgreSQL URL")?;
    run(&url).await.map(drop)
}
