//! What `jobs stats`, `jobs list` and `jobs blocked` print, as tables or JSON.

use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;

use super::{BlockedArgs, ListArgs, StatsArgs, with_conn};
use crate::cli::table::{Align, Table};
use crate::job_list::{self, JobFilter, JobRow};
use crate::outbox::{self, JobStatus, KindStats};
use crate::text::one_line;

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

pub(super) async fn stats(args: StatsArgs) -> anyhow::Result<()> {
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

pub(super) async fn list(args: ListArgs) -> anyhow::Result<()> {
    let filter = JobFilter {
        status: args.status,
        kind: args.kind.clone(),
        order_id: args.order_id,
        ..JobFilter::default()
    };
    let limit = i64::try_from(args.limit).unwrap_or(i64::MAX);
    let rows: Vec<JobRow> = with_conn(&args.db, move |conn| {
        job_list::list_jobs(conn, &filter, limit).context("listing jobs")
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
        ("WAITS FOR", Align::Left),
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
                .map_or_else(String::new, |e| one_line(e, 59)),
            waits_for(&job.waiting_on),
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

/// The parents a job waits for, as `jobs list` shows them: `job 7, job 9`.
fn waits_for(parents: &[i64]) -> String {
    parents
        .iter()
        .map(|id| format!("job {id}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `jobs blocked --json`: both kinds of held job.
#[derive(Debug, Serialize)]
struct BlockedJson<'a> {
    /// Ordering keys held up by a failed head.
    ordering_keys: &'a [outbox::BlockedKey],
    /// Dependents held by a failed parent (policy `hold`).
    dependents: &'a [outbox::HeldDependent],
}

pub(super) async fn blocked(args: BlockedArgs) -> anyhow::Result<()> {
    let limit = i64::try_from(args.limit).unwrap_or(i64::MAX);
    let (keys, dependents) = with_conn(&args.db, move |conn| {
        let keys = outbox::blocked_keys(conn, limit).context("listing blocked ordering keys")?;
        let dependents = outbox::held_dependents(conn, limit)
            .context("listing dependents held by a failed parent")?;
        Ok((keys, dependents))
    })
    .await?;
    if args.json {
        let json = BlockedJson {
            ordering_keys: &keys,
            dependents: &dependents,
        };
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    if keys.is_empty() {
        println!("no ordering key is blocked");
    } else {
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
                    .map_or_else(String::new, |e| one_line(e, 59)),
            ]);
        }
        print!("{table}");
    }
    println!();
    if dependents.is_empty() {
        println!("no dependent is held by a failed parent");
    } else {
        let mut table = Table::new(&[
            ("HELD JOB", Align::Right),
            ("KIND", Align::Left),
            ("POLICY", Align::Left),
            ("PARENT", Align::Right),
            ("PARENT KIND", Align::Left),
            ("PARENT STATUS", Align::Left),
            ("PARENT ERROR", Align::Left),
        ]);
        for held in &dependents {
            table.push(vec![
                held.job_id.to_string(),
                held.kind.clone(),
                held.dependency_policy.clone().unwrap_or_default(),
                held.parent_id.to_string(),
                held.parent_kind.clone(),
                held.parent_status.clone(),
                held.parent_error
                    .as_deref()
                    .map_or_else(String::new, |e| one_line(e, 59)),
            ]);
        }
        print!("{table}");
    }
    Ok(())
}
