//! `outbox-relay jobs ...`: what an operator runs to see and repair the queue.
//!
//! Each command opens one connection of its own (no pool, no migrations: an
//! operator command never changes the schema) and runs on a blocking thread.

use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Args, Subcommand};
use diesel::{Connection as _, PgConnection};
use serde::Serialize;

use super::table::{Align, Table, one_line};
use crate::config::{DatabaseArgs, parse_count, parse_positive_duration};
use crate::db::redact_url;
use crate::job_list::{self, JobFilter, JobRow};
use crate::outbox::{self, CancelReport, JobStatus, KindStats, RetryReport, RetrySelection};

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
    /// jobs wait behind it.
    ///
    /// A key resumes, in order, once its head is retried (`jobs retry ID`) and
    /// succeeds, or skips the head once it is cancelled (`jobs cancel ID`).
    Blocked(BlockedArgs),
}

#[derive(Debug, Args)]
pub struct BlockedArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Most keys shown, oldest head first.
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
    /// Only jobs of this kind (confirmation_email, receipt_pdf, order_webhook, noop, ...).
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
    }
}

/// Runs `f` on a fresh connection, on a blocking thread.
async fn with_conn<T, F>(db: &DatabaseArgs, f: F) -> anyhow::Result<T>
where
    F: FnOnce(&mut PgConnection) -> anyhow::Result<T> + Send + 'static,
    T: Send + 'static,
{
    let url = db.database_url.clone();
    tokio::task::spawn_blocking(move || {
        let mut conn = PgConnection::establish(&url)
            .with_context(|| format!("connecting to {}", redact_url(&url)))?;
        f(&mut conn)
    })
    .await?
}

/// `1 job`, `2 jobs`.
fn count_of(n: impl Into<i128>, one: &str, many: &str) -> String {
    match n.into() {
        1 => format!("1 {one}"),
        n => format!("{n} {many}"),
    }
}

/// A duration as an operator would type it: `7d`, `12h`, `90m`, else humantime's form.
fn short_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if d.subsec_nanos() != 0 || secs == 0 {
        return humantime::format_duration(d).to_string();
    }
    for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60)] {
        if secs.is_multiple_of(size) {
            return format!("{}{unit}", secs / size);
        }
    }
    format!("{secs}s")
}

fn age(seconds: Option<f64>) -> String {
    match seconds {
        Some(s) if s.is_finite() && s >= 0.0 => {
            humantime::format_duration(Duration::from_secs(s.floor() as u64)).to_string()
        }
        _ => "-".to_owned(),
    }
}

#[derive(Debug, Serialize)]
struct StatsJson<'a> {
    kinds: &'a [KindStats],
    pending: i64,
    processing: i64,
    done: i64,
    failed: i64,
    cancelled: i64,
    expired_leases: i64,
    oldest_due_pending_seconds: Option<f64>,
}

async fn stats(args: StatsArgs) -> anyhow::Result<()> {
    let stats = with_conn(&args.db, |conn| {
        outbox::queue_stats(conn).context("reading queue stats")
    })
    .await?;
    if args.json {
        let json = StatsJson {
            kinds: &stats.kinds,
            pending: stats.count(JobStatus::Pending),
            processing: stats.count(JobStatus::Processing),
            done: stats.count(JobStatus::Done),
            failed: stats.count(JobStatus::Failed),
            cancelled: stats.count(JobStatus::Cancelled),
            expired_leases: stats.expired_leases(),
            oldest_due_pending_seconds: stats.oldest_due_pending_seconds(),
        };
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    if stats.kinds.is_empty() {
        println!("no jobs");
        return Ok(());
    }
    let mut table = Table::new(&[
        ("KIND", Align::Left),
        ("PENDING", Align::Right),
        ("PROCESSING", Align::Right),
        ("DONE", Align::Right),
        ("FAILED", Align::Right),
        ("EXPIRED LEASES", Align::Right),
        ("OLDEST DUE PENDING", Align::Right),
        // Last: cancelled jobs are history, not queue health.
        ("CANCELLED", Align::Right),
    ]);
    for k in &stats.kinds {
        table.push(vec![
            k.kind.clone(),
            k.pending.to_string(),
            k.processing.to_string(),
            k.done.to_string(),
            k.failed.to_string(),
            k.expired_leases.to_string(),
            age(k.oldest_due_pending_seconds),
            k.cancelled.to_string(),
        ]);
    }
    table.push(vec![
        "TOTAL".to_owned(),
        stats.count(JobStatus::Pending).to_string(),
        stats.count(JobStatus::Processing).to_string(),
        stats.count(JobStatus::Done).to_string(),
        stats.count(JobStatus::Failed).to_string(),
        stats.expired_leases().to_string(),
        age(stats.oldest_due_pending_seconds()),
        stats.count(JobStatus::Cancelled).to_string(),
    ]);
    print!("{table}");
    Ok(())
}

async fn list(args: ListArgs) -> anyhow::Result<()> {
    let filter = JobFilter {
        status: args.status,
        kind: args.kind.clone(),
        order_id: args.order_id,
        limit: i64::try_from(args.limit).unwrap_or(i64::MAX),
    };
    let rows: Vec<JobRow> = with_conn(&args.db, move |conn| {
        job_list::list_jobs(conn, &filter).context("listing jobs")
    })
    .await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    if rows.is_empty() {
        println!("no jobs match");
        return Ok(());
    }
    let mut table = Table::new(&[
        ("ID", Align::Right),
        ("ORDER", Align::Right),
        ("KIND", Align::Left),
        ("STATUS", Align::Left),
        ("ATTEMPTS", Align::Right),
        ("RUN AFTER", Align::Left),
        ("LAST ERROR", Align::Left),
    ]);
    for job in &rows {
        table.push(vec![
            job.id.to_string(),
            job.order_id
                .map_or_else(|| "-".to_owned(), |id| id.to_string()),
            job.kind.clone(),
            job.status.clone(),
            format!("{}/{}", job.attempts, job.max_attempts),
            job.run_after.format("%Y-%m-%d %H:%M:%SZ").to_string(),
            job.last_error
                .as_deref()
                .map_or_else(String::new, |e| one_line(e, 60)),
        ]);
    }
    print!("{table}");
    if rows.len() == args.limit {
        eprintln!(
            "(the newest {} shown; raise --limit to see more)",
            args.limit
        );
    }
    Ok(())
}

async fn blocked(args: BlockedArgs) -> anyhow::Result<()> {
    let limit = i64::try_from(args.limit).unwrap_or(i64::MAX);
    let keys = with_conn(&args.db, move |conn| {
        outbox::blocked_keys(conn, limit).context("listing blocked ordering keys")
    })
    .await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&keys)?);
        return Ok(());
    }
    if keys.is_empty() {
        println!("no ordering key is blocked");
        return Ok(());
    }
    let mut table = Table::new(&[
        ("ORDERING KEY", Align::Left),
        ("HEAD JOB", Align::Right),
        ("KIND", Align::Left),
        ("ATTEMPTS", Align::Right),
        ("WAITING", Align::Right),
        ("LAST ERROR", Align::Left),
    ]);
    for key in &keys {
        table.push(vec![
            key.ordering_key.clone(),
            key.job_id.to_string(),
            key.kind.clone(),
            format!("{}/{}", key.attempts, key.max_attempts),
            key.waiting.to_string(),
            key.last_error
                .as_deref()
                .map_or_else(String::new, |e| one_line(e, 60)),
        ]);
    }
    print!("{table}");
    Ok(())
}

async fn retry(args: RetryArgs) -> anyhow::Result<()> {
    let selection = if args.failed {
        RetrySelection::AllFailed {
            kind: args.kind.clone(),
        }
    } else {
        RetrySelection::Ids(args.ids.clone())
    };
    let report: RetryReport = with_conn(&args.db, move |conn| {
        outbox::retry_failed_jobs(conn, &selection).context("retrying jobs")
    })
    .await?;
    if !report.refused.is_empty() {
        let reasons: Vec<String> = report.refused.iter().map(ToString::to_string).collect();
        anyhow::bail!(
            "refused: {}; only failed jobs can be retried, so nothing was changed",
            reasons.join("; ")
        );
    }
    match report.retried.len() {
        0 => println!(
            "no failed jobs{} to retry",
            args.kind
                .as_deref()
                .map(|k| format!(" of kind {k}"))
                .unwrap_or_default()
        ),
        n => println!(
            "retried {}: {}",
            count_of(n as u64, "job", "jobs"),
            report
                .retried
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
    Ok(())
}

async fn cancel(args: CancelArgs) -> anyhow::Result<()> {
    let ids = args.ids.clone();
    let report: CancelReport = with_conn(&args.db, move |conn| {
        outbox::cancel_jobs(conn, &ids).context("cancelling jobs")
    })
    .await?;
    if !report.refused.is_empty() {
        let reasons: Vec<String> = report.refused.iter().map(ToString::to_string).collect();
        anyhow::bail!(
            "refused: {}; only pending or failed jobs can be cancelled, so nothing was changed",
            reasons.join("; ")
        );
    }
    println!(
        "cancelled {}: {}",
        count_of(report.cancelled.len() as u64, "job", "jobs"),
        report
            .cancelled
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

async fn prune(args: PruneArgs) -> anyhow::Result<()> {
    let older_than = args.older_than;
    let age = short_duration(older_than);
    let total = with_conn(&args.db, move |conn| {
        outbox::count_prunable(conn, older_than).context("counting done jobs")
    })
    .await?;
    if args.dry_run {
        println!(
            "would delete {} that finished more than {age} ago (dry run: nothing was deleted)",
            count_of(total, "done job", "done jobs")
        );
        return Ok(());
    }
    let batch = i64::try_from(args.batch_size).unwrap_or(i64::MAX);
    let total = u64::try_from(total).unwrap_or(0);
    let mut progress = Progress::new(total, total > batch as u64);
    // Runs even when nothing is due: it also creates the coming days'
    // partitions and drops old empty ones.
    let report = with_conn(&args.db, move |conn| {
        let report =
            outbox::prune_done_jobs(conn, older_than, batch, |deleted| progress.update(deleted));
        progress.finish();
        report.context("pruning done jobs")
    })
    .await?;
    if report.deleted == 0 {
        println!("nothing to prune: no done jobs finished more than {age} ago");
    } else {
        // Whole days go as dropped partitions, strays as batched deletes;
        // the line names the ways that were used.
        let ways: Vec<String> = [
            (report.partitions_dropped > 0).then(|| {
                count_of(
                    report.partitions_dropped,
                    "dropped daily partition",
                    "dropped daily partitions",
                )
            }),
            (report.batches > 0).then(|| count_of(report.batches, "batch", "batches")),
        ]
        .into_iter()
        .flatten()
        .collect();
        println!(
            "deleted {} that finished more than {age} ago, in {}",
            count_of(report.deleted, "done job", "done jobs"),
            ways.join(" and ")
        );
    }
    if report.partitions_busy > 0 {
        anyhow::bail!(
            "{} stayed locked by other sessions (readers of jobs_all) and {} kept; \
             run the prune again",
            count_of(
                report.partitions_busy,
                "daily partition due for dropping",
                "daily partitions due for dropping"
            ),
            if report.partitions_busy == 1 {
                "was"
            } else {
                "were"
            }
        );
    }
    Ok(())
}

/// Progress of a prune on stderr: a bar on a terminal, otherwise a line at
/// most every second (logs of a cron job should show it moving, not flood).
struct Progress {
    total: u64,
    bar: Option<indicatif::ProgressBar>,
    lines: bool,
    last_line: Option<Instant>,
}

impl Progress {
    fn new(total: u64, large: bool) -> Progress {
        let terminal = std::io::stderr().is_terminal();
        let bar = (large && terminal).then(|| {
            let bar = indicatif::ProgressBar::with_draw_target(
                Some(total),
                indicatif::ProgressDrawTarget::stderr(),
            );
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} done jobs deleted ({eta} left)",
            ) {
                bar.set_style(style);
            }
            bar
        });
        Progress {
            total,
            bar,
            lines: large && !terminal,
            last_line: None,
        }
    }

    fn update(&mut self, deleted: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(deleted.min(self.total));
        } else if self.lines
            && self
                .last_line
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            self.last_line = Some(Instant::now());
            eprintln!("deleted {deleted} of ~{} done jobs", self.total);
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_shown_as_an_operator_types_them() {
        assert_eq!(short_duration(Duration::from_secs(7 * 86_400)), "7d");
        assert_eq!(short_duration(Duration::from_secs(36 * 3_600)), "36h");
        assert_eq!(short_duration(Duration::from_secs(90 * 60)), "90m");
        assert_eq!(short_duration(Duration::from_secs(45)), "45s");
        assert_eq!(short_duration(Duration::from_millis(1500)), "1s 500ms");
    }
}
