//! The floor under the publish row: what the contracts make each publish
//! job cost the server beyond its no-op twin and a raw publish, replayed
//! alone right after the drain, on the same server, with the relay's own
//! statements:
//! - the two rows written with its outcome, its attempt
//!   (`delivery_attempts`) and its ledger entry (`effect_results`);
//! - the read of its order and event that its body is rendered from
//!   (`load_batch.sql`), and, as the least any body needs, its event's row
//!   alone by key: what a body stored with its event would still read.
//!
//! The bound counts a publish job as its no-op twin plus one raw publish.
//! So `1 / (1/raw + 1/noop + 1/writes)` is the most a publish drain can reach
//! while it keeps the contract's rows, and `+ 1/read` the most while it also
//! reads what it sends, on the assumption the bound itself makes: on a
//! saturated machine, costs add up. How the relay handles a job, and renders
//! its body, are ours to make cheaper and are not in the floor.
//!
//! The replay is each statement at its cheapest, so that what it costs is
//! not ours to lower: both inserts in one statement (no transaction block,
//! no round trip between them), prepared, with as many rows a statement as
//! the relay can ever finish at once at this concurrency (and as many pairs
//! a read as its loader asks for at once), without
//! waiting for the commit's flush, on more connections than there are cores,
//! into emptied tables, the fastest of a few replays. The relay writes the
//! rows in the finish's transaction, after its update, at most as many a
//! statement.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::Context as _;
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Jsonb};
use order_service::db::PrepareOnce as _;
use order_service::effects::ledger::RECORD_EFFECTS_SQL;
use order_service::effects::nats::attempt_log::RECORD_ATTEMPTS_SQL;
use order_service::effects::nats::loader::{LOAD_BATCH_SQL, MAX_PAIRS_PER_READ};

use super::drain::{process_cpu_seconds, server_cpu_seconds};

/// Replays of each kind; the fastest counts. One replay of a 20,000-job
/// drain lasts a few tenths of a second, as noisy as a drain that short.
const PASSES: usize = 3;

/// Connections the replay writes on: two a core of this 2-core machine, so
/// that one's round trip leaves the cores to the others.
pub(super) const CONNECTIONS: usize = 4;

/// The statements the contracts ask of a drain's publish jobs, replayed
/// alone.
#[derive(Debug, Clone)]
pub struct ContractFloor {
    pub jobs: usize,
    pub rows_per_statement: usize,
    /// Both rows of each job.
    pub both: Replayed,
    /// The attempt row alone: what the ledger's row adds is the difference.
    pub attempt_only: Replayed,
    /// The relay's read of each job's order, items and event.
    pub read: Replayed,
    /// Each job's event row alone, by key: the least a body needs read.
    pub event_only: Replayed,
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

/// Gathers the attempt and ledger rows the publish drain wrote and the
/// `(order, event)` pairs it read, then replays them, `rows_per_statement`
/// jobs a statement (the reads [`MAX_PAIRS_PER_READ`]), each kind
/// [`PASSES`] times: the reads (nothing
/// changes), then, with both tables emptied, the attempts alone, then
/// (emptied again) both rows. The tables end holding the drain's publish
/// rows alone; the bench reads nothing else of them afterwards.
pub fn replay(url: &str, rows_per_statement: usize) -> anyhow::Result<ContractFloor> {
    let mut conn = PgConnection::establish(url)?;
    let rows = drain_rows(&mut conn)?;
    anyhow::ensure!(!rows.is_empty(), "the publish drain wrote no attempt");
    let (jobs, pairs): (Vec<_>, Vec<_>) = rows
        .into_iter()
        .map(|r| ((r.attempt, r.ledger), (r.order_id, r.event_id)))
        .unzip();
    let per_statement = rows_per_statement.max(1);
    let chunks: Vec<(serde_json::Value, serde_json::Value)> = jobs
        .chunks(per_statement)
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
    // The relay reads a claim's pairs at once, and a claim can run past the
    // concurrency: as many a statement as it reads at most. The events alone
    // by key keep the writes' batches, where they read fastest (740,773
    // jobs/s at 64 keys a statement, 321,052 to 345,208 at 256).
    let reads: Vec<Params> = pairs
        .chunks(MAX_PAIRS_PER_READ)
        .map(|chunk| {
            let (orders, events): (Vec<i64>, Vec<i64>) = chunk.iter().copied().unzip();
            Params::Pairs(orders, events)
        })
        .collect();
    let events: Vec<Params> = pairs
        .chunks(per_statement)
        .map(|chunk| Params::Keys(chunk.iter().map(|&(_, event)| event).collect()))
        .collect();
    let statement = one_statement();
    let mut best: [Option<Replayed>; 4] = [None, None, None, None];
    for _ in 0..PASSES {
        let read = replay_all(url, LOAD_BATCH_SQL, &reads, jobs.len())?;
        let event_only = replay_all(url, EVENTS_BY_KEY_SQL, &events, jobs.len())?;
        diesel::sql_query("TRUNCATE delivery_attempts, effect_results").execute(&mut conn)?;
        let attempt_only = replay_all(url, RECORD_ATTEMPTS_SQL, &attempts, jobs.len())?;
        diesel::sql_query("TRUNCATE delivery_attempts").execute(&mut conn)?;
        let both = replay_all(url, &statement, &both, jobs.len())?;
        for (best, this) in best.iter_mut().zip([both, attempt_only, read, event_only]) {
            *best = Some(faster(best.take(), this));
        }
    }
    let [Some(both), Some(attempt_only), Some(read), Some(event_only)] = best else {
        anyhow::bail!("no replay ran");
    };
    Ok(ContractFloor {
        jobs: jobs.len(),
        rows_per_statement,
        both,
        attempt_only,
        read,
        event_only,
    })
}

/// The least read a body needs: its event's row, by key, as a body stored
/// with its event would be read.
const EVENTS_BY_KEY_SQL: &str = "SELECT * FROM order_events WHERE id = ANY($1)";

/// The faster of two replays: the floor is the writes at their cheapest.
fn faster(best: Option<Replayed>, this: Replayed) -> Replayed {
    match best {
        Some(best) if best.jobs_per_second >= this.jobs_per_second => best,
        _ => this,
    }
}

/// The parameters of one replayed statement.
enum Params {
    /// The attempts' rows, for `record_attempts.sql`.
    Attempts(serde_json::Value),
    /// The attempts' rows and the ledger's, for [`one_statement`].
    Both(serde_json::Value, serde_json::Value),
    /// The orders' and the events' ids, side by side, for `load_batch.sql`.
    Pairs(Vec<i64>, Vec<i64>),
    /// The events' ids, for [`EVENTS_BY_KEY_SQL`].
    Keys(Vec<i64>),
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
            // The rows come back to this process as they would to the
            // relay; only their decoding is left out.
            Params::Pairs(orders, events) => query
                .bind::<Array<BigInt>, _>(orders)
                .bind::<Array<BigInt>, _>(events)
                .prepared()
                .execute(conn),
            Params::Keys(events) => query
                .bind::<Array<BigInt>, _>(events)
                .prepared()
                .execute(conn),
        }
    }
}

/// Runs `statement` once for each of `chunks`, on [`CONNECTIONS`]
/// connections at once (a read changes nothing; a write, what it writes).
fn replay_all(
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
                Ok(written) => written.context("replaying the contract's statements"),
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

/// What one publish job of the drain wrote and read.
#[derive(QueryableByName)]
struct DrainRow {
    /// Its successful attempt, in `record_attempts.sql`'s row format.
    #[diesel(sql_type = Jsonb)]
    attempt: serde_json::Value,
    /// Its ledger entry, in `record_effects.sql`'s row format.
    #[diesel(sql_type = Jsonb)]
    ledger: serde_json::Value,
    #[diesel(sql_type = BigInt)]
    order_id: i64,
    #[diesel(sql_type = BigInt)]
    event_id: i64,
}

/// Each job of the drain just run (the only jobs `jobs_done` holds: every
/// drain empties it first) whose ledger entry names a stream, in job order:
/// not the rows of an earlier round's drain, nor of the webhook and email
/// drain of `--effects real`, which the same tables hold.
fn drain_rows(conn: &mut PgConnection) -> anyhow::Result<Vec<DrainRow>> {
    Ok(diesel::sql_query(
        "SELECT jsonb_build_array(a.job_id, a.endpoint_id, a.attempt, \
                (extract(epoch FROM a.started_at) * 1000000)::bigint, a.duration_ms, \
                a.status_code, a.outcome, a.excerpt, a.stream_sequence) AS attempt, \
                jsonb_build_array(l.job_id, l.message_id, l.smtp_reply, l.endpoint, \
                l.webhook_id, l.status_code, l.answer_sha256, l.stream, l.stream_seq, \
                l.duplicate) AS ledger, \
                (d.payload ->> 'order_id')::bigint AS order_id, \
                (d.payload ->> 'event_id')::bigint AS event_id \
         FROM jobs_done AS d \
         JOIN effect_results AS l ON l.job_id = d.id \
         JOIN delivery_attempts AS a ON a.job_id = d.id AND a.outcome = 'ok' \
         WHERE l.stream IS NOT NULL \
         ORDER BY a.job_id, a.id",
    )
    .load(conn)?)
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
