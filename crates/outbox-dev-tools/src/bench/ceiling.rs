//! The raw-SQL ceiling: the claim CTE and one completion statement per batch,
//! looped on plain connections, with none of the relay's machinery. What the
//! design could do on this machine if the relay cost nothing. The claim is the
//! relay's own statement ([`CLAIM_SQL`], with a cursor per loop); the
//! completion (sql/ceiling_finish.sql) moves the batch to jobs_done without
//! the relay's busy/lost report. Both run prepared on tokio-postgres, as the
//! relay's do, over connections opened as the relay opens its own (TLS as the
//! URL says): a ceiling that parsed and planned every statement afresh would
//! be no ceiling for a relay that does not. Its claims keep a generic plan
//! exactly when the relay's would (`ClaimPlanner`).

use std::time::{Duration, Instant};

use diesel::prelude::*;

use super::queue::{drain_seconds, enqueue_noops};
use super::report::DrainRun;
use super::{BenchArgs, stats};
use outbox_core::statements::{
    CHECK_EVERY, CLAIM_PARAMS, CLAIM_SQL, ClaimPlanner, ClaimPosition, ClaimedJob,
};

pub async fn measure(url: &str, args: &BenchArgs) -> anyhow::Result<DrainRun> {
    measure_at(url, args, args.batch).await
}

pub async fn measure_at(url: &str, args: &BenchArgs, batch: usize) -> anyhow::Result<DrainRun> {
    let workers = args.ceiling_workers(batch);
    // The loops connect and prepare before the enqueue commits, which starts
    // the clock, as the relay under test is started idle before it.
    let mut loops = Vec::with_capacity(workers);
    for _ in 0..workers {
        loops.push(CeilingLoop::open(url, batch).await?);
    }
    let (url, jobs) = (url.to_owned(), args.jobs);
    let (mut conn, name, before, marks) = tokio::task::spawn_blocking(move || {
        let mut conn = PgConnection::establish(&url)?;
        let name = stats::conn_database(&mut conn)?;
        let before = stats::read(&mut conn, &name)?;
        let marks = enqueue_noops(&mut conn, jobs)?;
        anyhow::Ok((conn, name, before, marks))
    })
    .await??;
    let cpu_before = super::drain::process_cpu_seconds(None);
    let server_cpu_before = super::drain::server_cpu_seconds();
    let running: Vec<_> = loops
        .into_iter()
        .enumerate()
        .map(|(w, ceiling)| tokio::spawn(ceiling.run(format!("ceiling-{w}"))))
        .collect();
    for task in running {
        task.await
            .map_err(|_| anyhow::anyhow!("a ceiling loop panicked"))??;
    }
    let cpu = super::drain::process_cpu_seconds(None)
        .zip(cpu_before)
        .map(|(a, b)| a - b);
    let server_cpu = super::drain::server_cpu_seconds()
        .zip(server_cpu_before)
        .map(|(a, b)| a - b);
    tokio::task::spawn_blocking(move || {
        let seconds = drain_seconds(&mut conn, marks.committed_at)?;
        // Let the workers' backends publish their statistics before reading them.
        std::thread::sleep(Duration::from_millis(300));
        let after = stats::read(&mut conn, &name)?;
        let cost = stats::db_cost(&mut conn, jobs, &marks)?;
        Ok(
            DrainRun::new(jobs, batch, seconds, after - before, None, cpu)
                .with_workers(workers)
                .with_cost(cost)
                .with_server_cpu(server_cpu),
        )
    })
    .await?
}

/// One claim loop: its connection and its two prepared statements.
struct CeilingLoop {
    client: tokio_postgres::Client,
    claim: tokio_postgres::Statement,
    finish: tokio_postgres::Statement,
    planner: ClaimPlanner,
    batch: i64,
}

impl CeilingLoop {
    async fn open(url: &str, batch: usize) -> anyhow::Result<Self> {
        // Connected as the relay's own connections are, TLS as the URL says:
        // a ceiling on plain TCP against a relay on TLS measured the cipher
        // (2.7% of the relay's instructions) and the server's side of it as
        // the relay's machinery.
        let (client, connection) = outbox_core::statements::open_connection(url).await?;
        tokio::spawn(async move {
            // The loop's own statements report a broken connection.
            let _ = connection.await;
        });
        let claim = client.prepare_typed(CLAIM_SQL, CLAIM_PARAMS).await?;
        let planner = ClaimPlanner::prepare(&client).await?;
        let finish = client
            .prepare_typed(
                include_str!("sql/ceiling_finish.sql"),
                &[
                    tokio_postgres::types::Type::INT8_ARRAY,
                    tokio_postgres::types::Type::INT8_ARRAY,
                ],
            )
            .await?;
        Ok(CeilingLoop {
            client,
            claim,
            planner,
            finish,
            batch: i64::try_from(batch).unwrap_or(1),
        })
    }

    /// Claims and completes batches until a claim from the front finds nothing.
    async fn run(self, worker: String) -> anyhow::Result<()> {
        let kinds = vec!["noop".to_owned()];
        let lease_ms: i64 = 60_000;
        let mut cursor: Option<ClaimPosition> = None;
        // Planned as the relay's claim connections plan it: chosen now and
        // again every CHECK_EVERY.
        let mut plan_chosen: Option<Instant> = None;
        loop {
            if plan_chosen.is_none_or(|at| at.elapsed() >= CHECK_EVERY) {
                self.planner.choose(&self.client, &kinds).await?;
                plan_chosen = Some(Instant::now());
            }
            let rows = self
                .client
                .query(
                    &self.claim,
                    &[
                        &self.batch,
                        &kinds,
                        &worker,
                        &lease_ms,
                        &cursor.map(|at| at.run_after),
                        &cursor.map_or(0, |at| at.id),
                    ],
                )
                .await?;
            if rows.is_empty() {
                if cursor.is_none() {
                    return Ok(());
                }
                // Nothing ahead: jobs skipped while another loop held them may
                // still wait behind the cursor.
                cursor = None;
                continue;
            }
            let claimed = rows
                .iter()
                .map(ClaimedJob::from_row)
                .collect::<Result<Vec<_>, _>>()?;
            cursor = claimed.iter().map(ClaimedJob::position).max();
            let ids: Vec<i64> = claimed.iter().map(|c| c.id).collect();
            let tokens: Vec<i64> = claimed.iter().map(|c| c.lease_token).collect();
            self.client.execute(&self.finish, &[&ids, &tokens]).await?;
        }
    }
}
