//! The raw-SQL ceiling: the claim CTE and one completion statement per batch,
//! looped on plain connections, with none of the relay's machinery. What the
//! design could do on this machine if the relay cost nothing.

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt};

use super::report::DrainRun;
use super::{BenchArgs, drain_seconds, enqueue_noops, stats};
use crate::outbox::{ClaimRequest, claim_jobs};

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
    let start = enqueue_noops(&mut conn, jobs)?;
    let cpu_before = super::drain::process_cpu_seconds(None);

    let threads: Vec<_> = (0..workers)
        .map(|w| {
            let url = url.to_owned();
            std::thread::spawn(move || -> anyhow::Result<()> {
                let mut conn = PgConnection::establish(&url)?;
                let kinds = vec!["noop".to_owned()];
                let worker = format!("ceiling-{w}");
                loop {
                    let claimed = claim_jobs(
                        &mut conn,
                        &ClaimRequest {
                            worker_id: &worker,
                            kinds: &kinds,
                            limit: i64::try_from(batch).unwrap_or(1),
                            lease: Duration::from_secs(60),
                        },
                    )?;
                    if claimed.is_empty() {
                        return Ok(());
                    }
                    let ids: Vec<i64> = claimed.iter().map(|j| j.id).collect();
                    diesel::sql_query(
                        "UPDATE jobs SET status = 'done', finished_at = now(), lease_expires_at = NULL \
                         WHERE id = ANY($1)",
                    )
                    .bind::<Array<BigInt>, _>(&ids)
                    .execute(&mut conn)?;
                }
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
    let seconds = drain_seconds(&mut conn, start)?;
    // Let the workers' backends publish their statistics before reading them.
    std::thread::sleep(Duration::from_millis(300));
    let after = stats::read(&mut conn, &name)?;
    Ok(DrainRun::new(jobs, batch, seconds, after - before, None, cpu).with_workers(workers))
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
