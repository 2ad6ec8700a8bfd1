//! The floor under the publish row: the two rows the contracts write with
//! each publish's outcome, its attempt (`delivery_attempts`) and its ledger
//! entry (`effect_results`), replayed alone right after the drain that wrote
//! them, on the same server, with the relay's own statements.
//!
//! The bound counts a publish job as its no-op twin plus one raw publish. A
//! publish job also writes these two rows, which the contracts fix; how it
//! reads its order and renders its body, and the relay's own handling, are
//! ours to make cheaper. So `1 / (1/raw + 1/noop + 1/writes)` is the most a
//! publish drain can reach while it keeps them, on the assumption the bound
//! itself makes: on a saturated machine, costs add up.
//!
//! The replay is the writes at their cheapest, so that what it costs is not
//! ours to lower: both inserts in one statement (no transaction block, no
//! round trip between them), prepared, with as many rows a statement as the
//! relay can ever finish at once at this concurrency, without waiting for
//! the commit's flush, on more connections than there are cores, into
//! emptied tables, the fastest of a few replays. The relay writes them in
//! the finish's transaction, after its update, at most as many a statement.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::Context as _;
use diesel::prelude::*;
use diesel::sql_types::Jsonb;
use order_service::db::PrepareOnce as _;
use order_service::effects::ledger::RECORD_EFFECTS_SQL;
use order_service::effects::nats::attempt_log::RECORD_ATTEMPTS_SQL;

use super::drain::{process_cpu_seconds, server_cpu_seconds};

/// Replays of each kind; the fastest counts. One replay of a 20,000-job
/// drain lasts a few tenths of a second, as noisy as a drain that short.
const PASSES: usize = 3;

/// Connections the replay writes on: two a core of this 2-core machine, so
/// that one's round trip leaves the cores to the others.
pub(super) const CONNECTIONS: usize = 4;

/// The contract's writes of a drain's publish jobs, replayed alone.
#[derive(Debug, Clone)]
pub struct WritesFloor {
    pub jobs: usize,
    pub rows_per_statement: usize,
    /// Both rows of each job.
    pub both: Replayed,
    /// The attempt row alone: what the ledger's row adds is the difference.
    pub attempt_only: Replayed,
}

/// One replay of the drain's rows.
#[derive(Debug, Clone)]
pub struct Replayed {
    /// Jobs whose rows the replay wrote, a second.
    pub jobs_per_second: f64,
    /// The server's CPU a job, µs; `None` where it is not readable (a
    /// remote server).
    pub server_cpu_micros_per_job: Option<f64>,
    /// The bench process's own CPU a job (building and sending the rows), µs.
    pub client_cpu_micros_per_job: Option<f64>,
}

/// Reads the attempt and ledger rows the publish drain wrote, empties both
/// tables, and writes the rows again, `rows_per_statement` jobs a
/// statement: the attempts alone first, then (emptied again) both, each
/// [`PASSES`] times. The tables end as the drain left them.
pub fn replay(url: &str, rows_per_statement: usize) -> anyhow::Result<WritesFloor> {
    let mut conn = PgConnection::establish(url)?;
    let jobs = written_rows(&mut conn)?;
    anyhow::ensure!(!jobs.is_empty(), "the publish drain wrote no attempt");
    let chunks: Vec<(serde_json::Value, serde_json::Value)> = jobs
        .chunks(rows_per_statement.max(1))
        .map(|chunk| {
            let (attempts, ledger) = chunk.iter().cloned().unzip();
            (
                serde_json::Value::Array(attempts),
                serde_json::Value::Array(ledger),
            )
        })
        .collect();
    let attempts: Vec<Params> = chunks
        .iter()
        .map(|(attempts, _)| Params::Attempts(attempts.clone()))
        .collect();
    let both: Vec<Params> = chunks
        .into_iter()
        .map(|(attempts, ledger)| Params::Both(attempts, ledger))
        .collect();
    let statement = one_statement();
    let (mut best_attempts, mut best_both): (Option<Replayed>, Option<Replayed>) = (None, None);
    for _ in 0..PASSES {
        diesel::sql_query("TRUNCATE delivery_attempts, effect_results").execute(&mut conn)?;
        let attempt_only = write_all(url, RECORD_ATTEMPTS_SQL, &attempts, jobs.len())?;
        diesel::sql_query("TRUNCATE delivery_attempts").execute(&mut conn)?;
        let both = write_all(url, &statement, &both, jobs.len())?;
        best_attempts = Some(faster(best_attempts, attempt_only));
        best_both = Some(faster(best_both, both));
    }
    Ok(WritesFloor {
        jobs: jobs.len(),
        rows_per_statement,
        both: best_both.context("no replay ran")?,
        attempt_only: best_attempts.context("no replay ran")?,
    })
}

/// The faster of two replays: the floor is the writes at their cheapest.
fn faster(best: Option<Replayed>, this: Replayed) -> Replayed {
    match best {
        Some(best) if best.jobs_per_second >= this.jobs_per_second => best,
        _ => this,
    }
}

/// The parameters of one replayed statement: a JSON array of rows each.
enum Params {
    /// The attempts' rows, for `record_attempts.sql`.
    Attempts(serde_json::Value),
    /// The attempts' rows and the ledger's, for [`one_statement`].
    Both(serde_json::Value, serde_json::Value),
}

impl Params {
    fn execute(&self, statement: &str, conn: &mut PgConnection) -> QueryResult<usize> {
        let query = diesel::sql_query(statement);
        match self {
            Params::Attempts(rows) => query.bind::<Jsonb, _>(rows).prepared().execute(conn),
            Params::Both(attempts, ledger) => query
                .bind::<Jsonb, _>(attempts)
                .bind::<Jsonb, _>(ledger)
                .prepared()
                .execute(conn),
        }
    }
}

/// Runs `statement` once for each of `chunks`, on [`CONNECTIONS`]
/// connections at once.
fn write_all(
    url: &str,
    statement: &str,
    chunks: &[Params],
    jobs: usize,
) -> anyhow::Result<Replayed> {
    let mut writers = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        let mut conn = PgConnection::establish(url)?;
        diesel::sql_query("SET synchronous_commit = off").execute(&mut conn)?;
        writers.push(conn);
    }
    let next = AtomicUsize::new(0);
    let (server_before, client_before) = (server_cpu_seconds(), process_cpu_seconds(None));
    let started = Instant::now();
    std::thread::scope(|scope| {
        let handles: Vec<_> = writers
            .iter_mut()
            .map(|conn| {
                let next = &next;
                scope.spawn(move || -> QueryResult<()> {
                    while let Some(params) = chunks.get(next.fetch_add(1, Ordering::Relaxed)) {
                        params.execute(statement, conn)?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| match handle.join() {
                Ok(written) => written.context("replaying the contract's writes"),
                Err(_) => Err(anyhow::anyhow!("a replay thread panicked")),
            })
            .collect::<anyhow::Result<Vec<()>>>()
    })?;
    let seconds = started.elapsed().as_secs_f64();
    let per_job = |before: Option<f64>, after: Option<f64>| {
        before
            .zip(after)
            .map(|(before, after)| (after - before) * 1e6 / jobs as f64)
    };
    Ok(Replayed {
        jobs_per_second: jobs as f64 / seconds.max(f64::EPSILON),
        server_cpu_micros_per_job: per_job(server_before, server_cpu_seconds()),
        client_cpu_micros_per_job: per_job(client_before, process_cpu_seconds(None)),
    })
}

/// Both of the relay's statements as one: the attempts' insert as a
/// data-modifying `WITH` (which runs whether or not it is read), the
/// ledger's taking its rows as `$2`.
fn one_statement() -> String {
    format!(
        "WITH attempts AS (\n{}\nRETURNING 1)\n{}",
        RECORD_ATTEMPTS_SQL.trim_end().trim_end_matches(';'),
        RECORD_EFFECTS_SQL.replace("$1", "$2")
    )
}

/// Each publish job's successful attempt row and its ledger row, in the
/// relay's row format (the columns of `record_attempts.sql` and
/// `record_effects.sql`, in order), in job order. Only publishes: with
/// `--effects real` the tables also hold the webhook drain's rows.
fn written_rows(
    conn: &mut PgConnection,
) -> anyhow::Result<Vec<(serde_json::Value, serde_json::Value)>> {
    #[derive(QueryableByName)]
    struct Written {
        #[diesel(sql_type = Jsonb)]
        attempt: serde_json::Value,
        #[diesel(sql_type = Jsonb)]
        ledger: serde_json::Value,
    }
    let rows: Vec<Written> = diesel::sql_query(
        "SELECT jsonb_build_array(a.job_id, a.endpoint_id, a.attempt, \
                (extract(epoch FROM a.started_at) * 1000000)::bigint, a.duration_ms, \
                a.status_code, a.outcome, a.excerpt, a.stream_sequence) AS attempt, \
                jsonb_build_array(l.job_id, l.message_id, l.smtp_reply, l.endpoint, \
                l.webhook_id, l.status_code, l.answer_sha256, l.stream, l.stream_seq, \
                l.duplicate) AS ledger \
         FROM delivery_attempts AS a JOIN effect_results AS l USING (job_id) \
         WHERE l.stream IS NOT NULL AND a.outcome = 'ok' \
         ORDER BY a.job_id, a.id",
    )
    .load(conn)?;
    Ok(rows.into_iter().map(|r| (r.attempt, r.ledger)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_one_statement_keeps_both_inserts_and_numbers_the_ledgers_rows_second() {
        let statement = one_statement();
        assert!(statement.contains("INSERT INTO delivery_attempts"));
        assert!(statement.contains("INSERT INTO effect_results"));
        let (attempts, ledger) = statement
            .split_once("RETURNING 1)")
            .expect("the attempts' insert, then the ledger's");
        assert!(attempts.contains("jsonb_array_elements($1)") && !attempts.contains("$2"));
        assert!(ledger.contains("jsonb_array_elements($2)") && !ledger.contains("$1"));
    }
}
