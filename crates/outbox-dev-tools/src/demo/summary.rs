//! What the demo prints once the watch has ended: the jobs by kind, where
//! they went (`endpoints_summary.rs`), and where its files are.

use std::path::{Path, PathBuf};

use super::progress::KindCounts;
use super::sinks::webhook::Recorded;
use super::watch::Watched;
use super::{Demo, Ending, Placed};
use order_service::db;

impl Demo<'_> {
    pub(super) fn summarize(
        &self,
        placed: &[Placed],
        watched: &Watched,
        nats_messages: Option<anyhow::Result<u64>>,
    ) {
        let Demo {
            args,
            running,
            out,
            smtp,
            subscribers,
            started,
            ..
        } = self;
        let (jobs, receipts, ending) = (&watched.jobs, &watched.receipts, watched.ending);
        let elapsed = started.elapsed().as_secs_f64();
        let kinds = self.kinds();
        let total = |f: fn(&KindCounts) -> u64| -> u64 {
            kinds.iter().map(|k| f(&KindCounts::of(jobs, k))).sum()
        };
        println!();
        match ending {
            Ending::Settled => println!(
                "Done in {elapsed:.1}s: {} orders placed, {} jobs: {} done, {} failed.",
                placed.len(),
                jobs.len(),
                total(|c| c.done),
                total(|c| c.failed)
            ),
            _ => println!(
                "Stopped waiting after {elapsed:.1}s: {} orders placed, {} jobs: {} done, {} failed, {} not finished.",
                placed.len(),
                jobs.len(),
                total(|c| c.done),
                total(|c| c.failed),
                total(|c| c.pending + c.retrying + c.processing)
            ),
        }
        println!();
        println!(
            "  {:<20} {:>5} {:>7} {:>12} {:>9}",
            "KIND", "DONE", "FAILED", "NOT FINISHED", "ATTEMPTS"
        );
        for kind in &kinds {
            let c = KindCounts::of(jobs, kind);
            println!(
                "  {:<20} {:>5} {:>7} {:>12} {:>9}",
                kind,
                c.done,
                c.failed,
                c.pending + c.retrying + c.processing,
                c.attempts
            );
        }

        self.summarize_endpoints(jobs, placed, nats_messages);

        let mails = smtp.accepted();
        let requests: Vec<Recorded> = subscribers
            .webhooks
            .iter()
            .flat_map(|w| w.sink.requests())
            .collect();
        println!();
        println!("What the relay produced is in {}/:", out.root.display());
        println!(
            "  emails/    {} emails (confirmations with the receipt attached, shipping, cancellation, refund, expiry) as .eml files; open one in a mail client{}",
            mails.len(),
            first_file(mails.iter().filter_map(|m| m.saved_as.as_deref()))
        );
        println!(
            "  webhooks/  {} requests as JSON with their headers, answer and signature check, \
             in a directory per endpoint{}",
            requests.len(),
            first_file_in_dir(requests.iter().filter_map(|r| r.saved_as.as_deref()))
        );
        println!(
            "  receipts/  {} PDFs fetched from GET /orders/{{id}}/receipt.pdf{}",
            receipts.len(),
            first_file(receipts.iter().map(PathBuf::as_path))
        );

        let exe = command_name();
        println!();
        if args.keep_running {
            println!("Look further (while this runs):");
            println!(
                "  curl -H 'Authorization: Bearer {}' {}/orders/1",
                running.api_key, running.api_url
            );
            println!(
                "  DATABASE_URL={} {exe} jobs stats",
                db::redact_url(&running.database_url)
            );
            println!(
                "  DATABASE_URL={} {exe} jobs list",
                db::redact_url(&running.database_url)
            );
            println!(
                "  DATABASE_URL={} {exe} endpoints list",
                db::redact_url(&running.database_url)
            );
            if let Some(metrics) = &running.metrics_url {
                println!("  curl {metrics}");
            }
            if let Some(token) = &running.admin_token {
                println!();
                println!("Dashboard: {}/admin", running.api_url);
                println!("  log in with the admin token {token}");
            }
        } else {
            println!("Look further: the database is gone with the demo; to explore, run");
            println!("  {exe} demo --keep-running");
            println!(
                "which leaves the API and the relay up until Ctrl-C and prints the `jobs stats` \
                 command for its database."
            );
        }
    }
}

/// `(e.g. analytics/0001-….json)`: the first file with its directory's name.
fn first_file_in_dir<'a>(mut paths: impl Iterator<Item = &'a Path>) -> String {
    paths
        .next()
        .and_then(|path| {
            let dir = path.parent()?.file_name()?;
            let name = path.file_name()?;
            Some(format!(
                " (e.g. {}/{})",
                dir.to_string_lossy(),
                name.to_string_lossy()
            ))
        })
        .unwrap_or_default()
}

fn first_file<'a>(mut paths: impl Iterator<Item = &'a Path>) -> String {
    paths
        .next()
        .and_then(Path::file_name)
        .map(|name| format!(" (e.g. {})", name.to_string_lossy()))
        .unwrap_or_default()
}

/// How to run this binary again from here: its path relative to the current
/// directory when it is under it (`target/release/outbox-relay`), else its
/// name.
fn command_name() -> String {
    let exe = std::env::current_exe().ok();
    let cwd = std::env::current_dir().ok();
    match (exe, cwd) {
        (Some(exe), Some(cwd)) => match exe.strip_prefix(&cwd) {
            Ok(relative) => relative.display().to_string(),
            Err(_) => exe.display().to_string(),
        },
        _ => "outbox-relay".to_owned(),
    }
}
