//! What the demo prints once the watch has ended: the jobs by kind, the
//! webhook retries and event order it saw, and where its files are.

use std::path::{Path, PathBuf};

use super::progress::KindCounts;
use super::watch::Watched;
use super::{Demo, Ending, Placed, WEBHOOK_SECRET, samples};
use crate::db;

impl Demo<'_> {
    pub(super) fn summarize(&self, placed: &[Placed], watched: &Watched) {
        let Demo {
            args,
            running,
            out,
            smtp,
            webhook,
            started,
            ..
        } = self;
        let (jobs, receipts, ending) = (&watched.jobs, &watched.receipts, watched.ending);
        let elapsed = started.elapsed().as_secs_f64();
        let total = |f: fn(&KindCounts) -> u64| -> u64 {
            crate::orders::ORDER_JOB_KINDS
                .iter()
                .map(|k| f(&KindCounts::of(jobs, k)))
                .sum()
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
        for kind in crate::orders::ORDER_JOB_KINDS {
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

        let requests = webhook.requests();
        let flaky_key = requests
            .iter()
            .find(|r| samples::is_flaky_webhook(&r.body))
            .and_then(|r| r.header("idempotency-key").map(str::to_owned));
        if let Some(key) = flaky_key {
            let answers: Vec<String> = requests
                .iter()
                .filter(|r| r.header("idempotency-key") == Some(key.as_str()))
                .map(|r| r.answered.to_string())
                .collect();
            println!();
            println!(
                "  The receiver refused order #{}'s webhook on purpose: answers {} to the same \
                 request (Idempotency-Key {key}); the relay retried it with backoff.",
                placed.first().map_or(0, |p| p.id),
                answers.join(", ")
            );
        }

        // Each walked order's events as the receiver got them, in arrival order.
        for order in placed.iter().take(2) {
            let arrivals: Vec<String> = requests
                .iter()
                .filter_map(|r| {
                    let body: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
                    let id = body
                        .pointer("/data/order/id")
                        .or_else(|| body.pointer("/order/id"))
                        .and_then(serde_json::Value::as_i64)?;
                    (id == order.id).then(|| {
                        let seq = body
                            .pointer("/data/seq")
                            .and_then(serde_json::Value::as_i64);
                        let kind = body["type"].as_str().unwrap_or("order.placed");
                        let mark = if (200..300).contains(&r.answered) {
                            "✓".to_owned()
                        } else {
                            format!("✗{}", r.answered)
                        };
                        format!(
                            "{}{kind} {mark}",
                            seq.map(|s| format!("{s}:")).unwrap_or_default()
                        )
                    })
                })
                .collect();
            if arrivals.len() > 1 {
                println!(
                    "  Order #{}'s webhooks, in the order they arrived: {}",
                    order.id,
                    arrivals.join(" → ")
                );
            }
        }
        if placed.len() >= 2 {
            println!(
                "  Events of one order share an ordering key: a refused delivery holds back \
                 the order's later events until it succeeds."
            );
        }

        let mails = smtp.accepted();
        let signed = requests
            .iter()
            .filter(|r| r.signature_valid == Some(true))
            .count();
        println!();
        println!("What the relay produced is in {}/:", out.root.display());
        println!(
            "  emails/    {} emails (confirmations, shipping, cancellation) as .eml files; open one in a mail client{}",
            mails.len(),
            first_file(mails.iter().filter_map(|m| m.saved_as.as_deref()))
        );
        println!(
            "  webhooks/  {} requests as JSON with their headers; {signed} of {} signatures valid \
             (WEBHOOK_SECRET={WEBHOOK_SECRET}){}",
            requests.len(),
            requests.len(),
            first_file(requests.iter().filter_map(|r| r.saved_as.as_deref()))
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
            println!("  curl {}/metrics", running.api_url);
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
