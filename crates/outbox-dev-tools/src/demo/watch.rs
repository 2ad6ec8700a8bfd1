//! When the demo's jobs have all finished: the jobs table followed until it
//! settles, each rendered receipt fetched from the API on the way.

use std::path::{Path, PathBuf};
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::progress::{self, JobState, LiveView, Narrator};
use super::services::Running;
use super::{Ending, OutDir, POLL_EVERY, SETTLE_DEADLINE, sinks};
use order_service::db::run_blocking;

/// What the watch saw last.
#[derive(Debug)]
pub(super) struct Watched {
    pub(super) ending: Ending,
    pub(super) jobs: Vec<JobState>,
    /// Receipts saved, by order id.
    pub(super) receipts: Vec<PathBuf>,
}

/// Follows the jobs table until every job (at least
/// `expected` of them) has finished
/// and every rendered receipt has been fetched, or the deadline passes, or
/// Ctrl-C. Returns the last snapshot and the receipts saved.
pub(super) async fn watch(
    running: &Running,
    out: &OutDir,
    client: &reqwest::Client,
    view: &LiveView,
    (mut narrator, expected): (Narrator, usize),
    shutdown: &CancellationToken,
) -> Watched {
    let deadline = Instant::now() + SETTLE_DEADLINE;
    let mut receipts: Vec<(i64, PathBuf)> = Vec::new();
    let mut jobs: Vec<JobState> = Vec::new();
    let mut last_error: Option<String> = None;
    loop {
        match run_blocking(&running.watch_pool, |conn| Ok(progress::load_jobs(conn)?)).await {
            Ok(snapshot) => {
                jobs = snapshot;
                last_error = None;
            }
            Err(error) => {
                let error = format!("reading the jobs table: {error}");
                if last_error.as_ref() != Some(&error) {
                    view.line(format!("  ! {error}"));
                }
                last_error = Some(error);
            }
        }
        for line in narrator.observe(&jobs, chrono::Utc::now()) {
            view.line(line);
        }
        view.show(&jobs);

        let rendered: Vec<i64> = jobs
            .iter()
            .filter(|j| j.kind == "receipt_pdf" && j.status == "done")
            .filter_map(|j| j.order_id)
            .filter(|id| !receipts.iter().any(|(done, _)| done == id))
            .collect();
        for order_id in rendered {
            match fetch_receipt(client, &running.api_url, order_id, &out.receipts).await {
                Ok(path) => receipts.push((order_id, path)),
                Err(error) => view.line(format!("  ! receipt of order #{order_id}: {error:#}")),
            }
        }

        let all_finished = jobs.len() >= expected && jobs.iter().all(JobState::is_finished);
        let receipts_due = jobs
            .iter()
            .filter(|j| j.kind == "receipt_pdf" && j.status == "done")
            .count();
        if all_finished && receipts.len() >= receipts_due {
            return watched(Ending::Settled, jobs, receipts);
        }
        if Instant::now() >= deadline {
            return watched(Ending::TimedOut, jobs, receipts);
        }
        tokio::select! {
            () = shutdown.cancelled() => return watched(Ending::Interrupted, jobs, receipts),
            () = tokio::time::sleep(POLL_EVERY) => {}
        }
    }
}

fn watched(ending: Ending, jobs: Vec<JobState>, mut receipts: Vec<(i64, PathBuf)>) -> Watched {
    receipts.sort();
    Watched {
        ending,
        jobs,
        receipts: receipts.into_iter().map(|(_, path)| path).collect(),
    }
}

/// `GET /orders/{id}/receipt.pdf`, saved as `order-{id}.pdf`.
async fn fetch_receipt(
    client: &reqwest::Client,
    api_url: &str,
    order_id: i64,
    dir: &Path,
) -> anyhow::Result<PathBuf> {
    let response = client
        .get(format!("{api_url}/orders/{order_id}/receipt.pdf"))
        .send()
        .await?;
    let status = response.status();
    anyhow::ensure!(
        status == reqwest::StatusCode::OK,
        "GET /orders/{order_id}/receipt.pdf answered {status}"
    );
    let pdf = response.bytes().await?;
    anyhow::ensure!(
        pdf.starts_with(b"%PDF-"),
        "GET /orders/{order_id}/receipt.pdf did not answer a PDF"
    );
    let path = sinks::save(dir, &format!("order-{order_id}.pdf"), pdf.to_vec()).await?;
    Ok(path)
}
