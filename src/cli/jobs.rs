//! `outbox-relay jobs ...`: what an operator runs to see and repair the queue.
//!
//! Each command opens one connection of its own (no pool, no migrations: an
//! operator command never changes the schema) and runs on a blocking thread.
//!
//! This file holds the commands' flags and what they share; the reports
//! (`stats`, `list`, `blocked`), the repairs (`retry`, `cancel`), `prune`
//! and `schedules` have files of their own.

mod prune;
mod repair;
mod reports;
mod schedules;

use std::time::Duration;

use clap::{Args, Subcommand};

pub(super) use crate::cli::with_conn;
use crate::config::{DatabaseArgs, parse_count, parse_positive_duration};
use crate::outbox::JobStatus;
use prune::prune;
use repair::{cancel, retry};
use reports::{blocked, list, stats};
use schedules::schedules;

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// Counts by status and kind, the age of the oldest due pending job, and expired leases.
    ///
    /// "oldest due pending" is how long the oldest job that could run now has
    /// been waiting: a growing value means the relays are not keeping up.
    /// "expired leases" are processing jobs whose worker stopped renewing its
    /// lease; the reaper puts them back.
    Stats(StatsArgs),
    /// A table of jobs, newest first.
    #[command(after_help = "Examples:\n  \
        outbox-relay jobs list --status failed\n  \
        outbox-relay jobs list --order 42\n  \
        outbox-relay jobs list --kind order_webhook --limit 200 --json | jq '.[].last_error'")]
    List(ListArgs),
    /// Put failed jobs back to pending: attempts reset, due now.
    ///
    /// last_error is kept until the next attempt replaces it. Naming a job that
    /// is not failed (or does not exist) refuses the whole command: nothing changes.
    #[command(after_help = "Examples:\n  \
        outbox-relay jobs retry 17 18\n  \
        outbox-relay jobs retry --failed --kind order_webhook")]
    Retry(RetryArgs),
    /// Give up on jobs that are not finished: pending or failed jobs become cancelled.
    ///
    /// A processing job is refused (a relay may be performing its effect right
    /// now): cancel it after it finishes or after its lease is reaped. Naming a
    /// job that cannot be cancelled (or does not exist) refuses the whole
    /// command: nothing changes.
    #[command(after_help = "Examples:\n  \
        outbox-relay jobs cancel 17 18")]
    Cancel(CancelArgs),
    /// Delete done jobs that finished longer ago than --older-than.
    ///
    /// Done jobs live in jobs_done, one partition per day (UTC) of finished_at:
    /// a day whose every job is older than --older-than is dropped whole, so a
    /// done job is kept at least --older-than and at most one day more. The
    /// rare rows of days that had no partition (jobs_done_default) are deleted
    /// in batches, each its own short transaction. Each drop waits at most 2s
    /// for its lock and is retried, so relays are never held up for long.
    #[command(after_help = "Examples:\n  \
        outbox-relay jobs prune --older-than 7d --dry-run\n  \
        outbox-relay jobs prune --older-than 30d")]
    Prune(PruneArgs),
    /// Ordering keys held up by a failed head job, with that job and how many
    /// jobs wait behind it; then dependents held by a failed parent, with the
    /// parent and its status.
    ///
    /// A key resumes, in order, once its head is retried (`jobs retry ID`) and
    /// succeeds, or skips the head once it is cancelled (`jobs cancel ID`). A
    /// held dependent (policy `hold`) runs once its parent is retried and
    /// succeeds; cancelling the parent cancels it.
    Blocked(BlockedArgs),
    /// Periodic jobs: name, schedule, kind, last run (the newest slot
    /// enqueued, and its job), next run.
    ///
    /// Relays declare their periodic jobs when they start; each slot is
    /// enqueued once however many relays run, and slots missed while every
    /// relay was down run once when one comes back. Times are UTC.
    #[command(after_help = "Examples:\n  \
        outbox-relay jobs schedules\n  \
        outbox-relay jobs schedules --json | jq '.[] | {name, next_run}'")]
    Schedules(SchedulesArgs),
}

#[derive(Debug, Args)]
pub struct SchedulesArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// One JSON array: `{"name","schedule","kind","last_run","last_job_id","next_run","declared_at","seen_at"}`.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct BlockedArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Most keys shown, oldest head first, and most held dependents, oldest
    /// failed parent first.
    #[arg(long, default_value_t = 50, value_parser = crate::config::parse_count)]
    limit: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Only jobs in this status: pending, processing, done, failed or cancelled.
    #[arg(long, value_parser = parse_status)]
    status: Option<JobStatus>,
    /// Only jobs of this kind (confirmation_email, order_email, receipt_pdf, order_webhook, noop, ...).
    #[arg(long, value_parser = parse_kind)]
    kind: Option<String>,
    /// Only the jobs of this order.
    #[arg(long = "order", value_name = "ORDER_ID", value_parser = clap::value_parser!(i64).range(1..))]
    order_id: Option<i64>,
    /// Show at most this many jobs (the newest).
    #[arg(long, default_value_t = 50, value_parser = parse_count)]
    limit: usize,
    /// One JSON array with every column and untruncated errors, for scripts.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["ids", "failed"])))]
pub struct RetryArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Ids of failed jobs to retry.
    #[arg(
        value_name = "JOB_ID",
        conflicts_with = "failed",
        value_parser = clap::value_parser!(i64).range(1..)
    )]
    ids: Vec<i64>,
    /// Retry every failed job instead of naming them (narrow it with --kind).
    #[arg(long)]
    failed: bool,
    /// With --failed: only failed jobs of this kind.
    #[arg(long, requires = "failed", value_parser = parse_kind)]
    kind: Option<String>,
}

#[derive(Debug, Args)]
pub struct CancelArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Ids of pending or failed jobs to cancel.
    #[arg(
        value_name = "JOB_ID",
        required = true,
        value_parser = clap::value_parser!(i64).range(1..)
    )]
    ids: Vec<i64>,
}

#[derive(Debug, Args)]
pub struct PruneArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Delete done jobs whose finished_at is older than this: 7d, 12h, 30m
    /// (whole days go once the whole day is older than this).
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    older_than: Duration,
    /// Count what would be deleted, and delete nothing.
    #[arg(long)]
    dry_run: bool,
    /// Rows deleted per transaction from jobs_done_default (whole days are
    /// dropped, not deleted, so this does not apply to them).
    #[arg(long, default_value_t = 1000, value_parser = parse_count)]
    batch_size: usize,
}

fn parse_status(raw: &str) -> Result<JobStatus, String> {
    raw.trim().parse()
}

fn parse_kind(raw: &str) -> Result<String, String> {
    let kind = raw.trim();
    if kind.is_empty() {
        return Err("must not be empty".into());
    }
    Ok(kind.to_owned())
}

pub async fn run(command: JobsCommand) -> anyhow::Result<()> {
    match command {
        JobsCommand::Stats(args) => stats(args).await,
        JobsCommand::List(args) => list(args).await,
        JobsCommand::Retry(args) => retry(args).await,
        JobsCommand::Cancel(args) => cancel(args).await,
        JobsCommand::Prune(args) => prune(args).await,
        JobsCommand::Blocked(args) => blocked(args).await,
        JobsCommand::Schedules(args) => schedules(args).await,
    }
}

/// `1 job`, `2 jobs`.
fn count_of(n: impl Into<i128>, one: &str, many: &str) -> String {
    match n.into() {
        1 => format!("1 {one}"),
        n => format!("{n} {many}"),
    }
}
