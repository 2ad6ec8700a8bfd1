//! Time, with nothing but `outbox_core`: a periodic job that every relay
//! declares and yet runs once a slot, and a scheduled job cancelled in the
//! transaction that made it pointless.
//!
//! ```sh
//! createdb -h 127.0.0.1 -U postgres outbox_example
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/outbox_example \
//!     cargo run --example periodic_and_scheduled
//! ```
//!
//! It migrates the database (the queue's tables only), schedules two payment
//! reminders a second ahead, cancels one of them as its payment arrives,
//! runs two relays that both declare a sweep every second for three seconds,
//! and prints the schedule as `outbox-relay jobs schedules` would.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use chrono::Utc;
use diesel::prelude::*;
use outbox_core::outbox::{CancelOutcome, Enqueuer, JobOptions, PeriodicJob, periodic_schedules};
use outbox_core::schema::jobs_all;
use outbox_core::worker::{EffectResult, JobArgs, JobContext, Worker, Workers};
use outbox_core::worker_pool::{PoolSettings, WorkerPool};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

/// Runs at each slot of its schedule.
#[derive(Debug, Serialize, Deserialize)]
pub struct SweepSessions {}

impl JobArgs for SweepSessions {
    const KIND: &'static str = "sweep_sessions";
}

/// Runs at a time, unless the payment comes first.
#[derive(Debug, Serialize, Deserialize)]
pub struct RemindToPay {
    pub invoice: i64,
}

impl JobArgs for RemindToPay {
    const KIND: &'static str = "remind_to_pay";
}

#[derive(Debug, Clone)]
struct Print;

impl Worker<SweepSessions> for Print {
    async fn work(&self, _args: SweepSessions, ctx: JobContext) -> EffectResult {
        println!("  sweep (job {})", ctx.id());
        Ok(None)
    }
}

impl Worker<RemindToPay> for Print {
    async fn work(&self, args: RemindToPay, ctx: JobContext) -> EffectResult {
        println!("  reminder for invoice {} (job {})", args.invoice, ctx.id());
        Ok(None)
    }
}

/// What [`run`] did, for the caller (and the test that runs this example).
#[derive(Debug)]
pub struct Report {
    /// What the payment's cancel said.
    pub cancel: CancelOutcome,
    /// The unpaid reminder's status, and the paid one's.
    pub reminders: (String, String),
    /// Sweep jobs enqueued, and their distinct slots.
    pub sweeps: (i64, i64),
}

pub async fn run(database_url: &str) -> anyhow::Result<Report> {
    let url = database_url.to_owned();
    let mut conn = tokio::task::spawn_blocking(move || -> anyhow::Result<PgConnection> {
        let mut conn = outbox_core::db::establish(&url)?;
        outbox_core::db::run_migrations(&mut conn)?;
        Ok(conn)
    })
    .await??;

    // Scheduled: an ordinary job whose run_after is ahead.
    let enqueuer = Enqueuer::new();
    let at = Utc::now() + chrono::Duration::seconds(1);
    let options = JobOptions::default().run_after(at);
    let unpaid = enqueuer.enqueue(&mut conn, &RemindToPay { invoice: 1 }, &options)?;
    let paid = enqueuer.enqueue(&mut conn, &RemindToPay { invoice: 2 }, &options)?;
    // Invoice 2 is paid: the payment's writes and the cancel commit together.
    let outcome = conn.transaction(|conn| -> QueryResult<CancelOutcome> {
        // ... record the payment on `conn` ...
        enqueuer.cancel(conn, paid)
    })?;
    println!("reminders {unpaid} and {paid} due at {at}; {paid} on payment: {outcome:?}");

    // Periodic: declared on each relay's settings; each slot runs once.
    let sweep = PeriodicJob::every("sweep_sessions", Duration::from_secs(1), &SweepSessions {})?;
    let shutdown = CancellationToken::new();
    let mut relays = Vec::new();
    for name in ["relay-a", "relay-b"] {
        let workers = Workers::new()
            .register::<SweepSessions, _>(Print)
            .register::<RemindToPay, _>(Print);
        let kinds = workers.kinds().iter().map(|k| (*k).to_owned()).collect();
        let mut settings = PoolSettings::new(name, kinds);
        settings.periodic_jobs = vec![sweep.clone()];
        let pool = outbox_core::db::build_pool(database_url, &Default::default());
        let relay = WorkerPool::new(pool, database_url.to_owned(), settings, Arc::new(workers))?;
        relays.push(tokio::spawn(relay.run_until_stopped(shutdown.clone())));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    shutdown.cancel();
    for relay in relays {
        relay.await.context("a relay task")?;
    }

    for schedule in periodic_schedules(&mut conn, Utc::now())? {
        println!(
            "{}: {} (kind {}), last run {:?}, next run {:?}",
            schedule.name, schedule.schedule, schedule.kind, schedule.last_run, schedule.next_run
        );
    }
    let mut status = |id: i64| -> QueryResult<String> {
        jobs_all::table
            .filter(jobs_all::id.eq(id))
            .select(jobs_all::status)
            .get_result(&mut conn)
    };
    let reminders = (status(unpaid)?, status(paid)?);
    let slots: Vec<chrono::DateTime<Utc>> = jobs_all::table
        .filter(jobs_all::kind.eq(SweepSessions::KIND))
        .select(jobs_all::run_after)
        .load(&mut conn)?;
    let distinct: std::collections::BTreeSet<_> = slots.iter().collect();
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    let sweeps = (count(slots.len()), count(distinct.len()));
    Ok(Report {
        cancel: outcome,
        reminders,
        sweeps,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("DATABASE_URL").context("set DATABASE_URL to a PostgreSQL URL")?;
    run(&url).await.map(drop)
}
