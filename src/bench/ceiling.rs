//! The raw-SQL ceiling: the claim CTE and one completion statement per batch,
//! looped on plain connections, with none of the relay's machinery. What the
//! design could do on this machine if the relay cost nothing. Both statements
//! are layout v2's (sql/ceiling_claim.sql, sql/ceiling_finish.sql): a claim
//! with a cursor over the unfinished jobs, and a completion that moves the
//! batch to jobs_done.

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Text, Timestamptz};

use super::report::DrainRun;
use super::{BenchArgs, drain_seconds, enqueue_noops, stats};

pub async fn measure(url: &str, args: &BenchArgs) -> anyhow::Result<DrainRun> {
    measure_at(url, args, args.batch).await
}

pub async fn measure_at(url: &str, args: &BenchArgs, batch: usize) -> anyhow::Result<DrainRun> {
    let url = url.to_owned();
    let jobs = args.jobs;
    let workers = args.ceiling_workers(batch);
    tokio::task::spawn_blocking(move || run(&url, jobs, workers, batch)).await?
}

/// One claimed row: what the cursor and the fenced completion need.
#[derive(QueryableByName)]
struct Claimed {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Timestamptz)]
    run_after: chrono::DateTime<chrono::Utc>,
    #[diesel(sql_type = BigInt)]
    lease_token: i64,
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
    // Before any bench job's run_after (the Unix epoch), and inside
    // PostgreSQL's timestamp range, unlike chrono's MIN_UTC.
    let front = (chrono::DateTime::<chrono::Utc>::default(), 0_i64);
    let mut cursor = front;
    loop {
        let claimed: Vec<Claimed> = diesel::sql_query(include_str!("sql/ceiling_claim.sql"))
            .bind::<BigInt, _>(i64::try_from(batch).unwrap_or(1))
            .bind::<Array<Text>, _>(&kinds)
            .bind::<Text, _>(worker)
            .bind::<BigInt, _>(60_000_i64)
            .bind::<Timestamptz, _>(cursor.0)
            .bind::<BigInt, _>(cursor.1)
            .load(conn)?;
        if claimed.is_empty() {
            if cursor == front {
                return Ok(());
            }
            // Nothing ahead: jobs skipped while another loop held them may
            // still wait behind the cursor.
            cursor = front;
            continue;
        }
        if let Some(last) = claimed.iter().map(|c| (c.run_after, c.id)).max() {
            cursor = last;
        }
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
