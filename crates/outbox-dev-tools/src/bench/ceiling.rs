//! The raw-SQL ceiling: the claim CTE and one completion statement per batch,
//! looped on plain connections, with none of the relay's machinery. What the
//! design could do on this machine if the relay cost nothing. The claim is the
//! relay's own statement ([`claim_jobs`] / [`claim_jobs_after`], with a cursor
//! per loop); the completion (sql/ceiling_finish.sql) moves the batch to
//! jobs_done without the relay's busy/lost report.

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt};

use super::report::DrainRun;
use super::{BenchArgs, drain_seconds, enqueue_noops, stats};
use outbox_core::driver::{ClaimPosition, ClaimRequest, claim_jobs, claim_jobs_after};

pub async fn measure(url: &str, args: &BenchArgs) -> anyhow::Result<DrainRun> {
    measure_at(url, args, args.batch).await
}

pub async fn measure_at(url: &str, args: &BenchArgs, batch: usize) -> anyhow::Result<DrainRun> {
    let url = url.to_owned();
    let jobs = args.jobs;
    let workers = args.ceiling_workers(batch);
    tokio::task::spawn_blocking(move || run(&url, jobs, workers, batch)).await?
}

fn run(url: &str, jobs: usize, workers: usize, batch: usize) -> anyhow::Result<DrainRun> {
    let mut conn = PgConnection::establish(url)?;
    let name = conn_database(&mut conn)?;
    let before = stats::read(&mut conn, &name)?;
    let marks = enqueue_noops(&mut conn, jobs)?;
    let cpu_before = super::drain::process_cpu_seconds(None);

    let threads: Vec<_> = (0..workers)
        .map(|w| {
            let url = url.to_owned();
            std::thread::spawn(move || -> anyhow::Result<()> {
                let mut conn = PgConnection::establish(&url)?;
                claim_loop(&mut conn, &format!("ceiling-{w}"), batch)
            })
        })
        .collect();
    for thread in threads {
        thread
            .join()
            .map_err(|_| anyhow::anyhow!("a ceiling worker panicked"))??;
    }
    let cpu = super::drain::process_cpu_seconds(None)
        .zip(cpu_before)
        .map(|(a, b)| a - b);
    let seconds = drain_seconds(&mut conn, marks.committed_at)?;
    // Let the workers' backends publish their statistics before reading them.
    std::thread::sleep(Duration::from_millis(300));
    let after = stats::read(&mut conn, &name)?;
    let cost = stats::db_cost(&mut conn, jobs, &marks)?;
    Ok(
        DrainRun::new(jobs, batch, seconds, after - before, None, cpu)
            .with_workers(workers)
            .with_cost(cost),
    )
}

/// Claims and completes batches until a claim from the front finds nothing.
fn claim_loop(conn: &mut PgConnection, worker: &str, batch: usize) -> anyhow::Result<()> {
    let kinds = vec!["noop".to_owned()];
    let request = ClaimRequest {
        worker_id: worker,
        kinds: &kinds,
        limit: i64::try_from(batch).unwrap_or(1),
        lease: Duration::from_secs(60),
    };
    let mut cursor: Option<ClaimPosition> = None;
    loop {
        let claimed = match cursor {
            Some(after) => claim_jobs_after(conn, &request, after)?,
            None => claim_jobs(conn, &request)?,
        };
        if claimed.is_empty() {
            if cursor.is_none() {
                return Ok(());
            }
            // Nothing ahead: jobs skipped while another loop held them may
            // still wait behind the cursor.
            cursor = None;
            continue;
        }
        cursor = claimed.iter().map(|c| c.position()).max();
        let ids: Vec<i64> = claimed.iter().map(|c| c.id).collect();
        let tokens: Vec<i64> = claimed.iter().map(|c| c.lease_token).collect();
        diesel::sql_query(include_str!("sql/ceiling_finish.sql"))
            .bind::<Array<BigInt>, _>(&ids)
            .bind::<Array<BigInt>, _>(&tokens)
            .execute(conn)?;
    }
}

pub(super) fn conn_database(conn: &mut PgConnection) -> anyhow::Result<String> {
    #[derive(QueryableByName)]
    struct Name {
        #[diesel(sql_type = diesel::sql_types::Text)]
        name: String,
    }
    let row: Name =
        diesel::sql_query("SELECT current_database()::text AS name").get_result(conn)?;
    Ok(row.name)
}
