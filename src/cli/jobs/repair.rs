//! How `jobs retry` and `jobs cancel` change jobs, all or none, and say what
//! they refused.

use anyhow::Context as _;

use super::{CancelArgs, RetryArgs, count_of, with_conn};
use crate::outbox::{self, CancelReport, RetryReport, RetrySelection};

pub(super) async fn retry(args: RetryArgs) -> anyhow::Result<()> {
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

pub(super) async fn cancel(args: CancelArgs) -> anyhow::Result<()> {
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
