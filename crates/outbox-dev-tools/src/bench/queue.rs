//! The bench's own statements on the queue: enqueueing its jobs timed against
//! the server's counters, and watching the drain end.

use anyhow::Context as _;
use diesel::prelude::*;

use super::stats;

/// Inserts `n` due `noop` jobs in one transaction; the marks say when they
/// became visible and where the server's counters stood around the enqueue.
pub(super) fn enqueue_noops(
    conn: &mut PgConnection,
    n: usize,
) -> anyhow::Result<stats::EnqueueMarks> {
    enqueue_timed(conn, "jobs", "noop", |conn| {
        diesel::sql_query(
            // has_dependents false, as the enqueue writes a job nothing waits for.
            "INSERT INTO jobs (kind, payload, has_dependents) \
             SELECT 'noop', '{}'::jsonb, false FROM generate_series(1, $1)",
        )
        .bind::<diesel::sql_types::BigInt, _>(i64::try_from(n).unwrap_or(i64::MAX))
        .execute(conn)
        .map(drop)
    })
}

/// Inserts `n` due `noop` jobs spread round-robin over `keys` concurrency
/// keys (each given its row, with no limits, as the enqueue does), in one
/// transaction, timed like [`enqueue_noops`].
pub(super) fn enqueue_keyed_noops(
    conn: &mut PgConnection,
    n: usize,
    keys: usize,
) -> anyhow::Result<stats::EnqueueMarks> {
    use diesel::sql_types::BigInt;
    let keys = i64::try_from(keys.max(1)).unwrap_or(i64::MAX);
    enqueue_timed(conn, "jobs", "noop", |conn| {
        diesel::sql_query("DELETE FROM job_concurrency_keys").execute(conn)?;
        diesel::sql_query(
            "INSERT INTO job_concurrency_keys (key) SELECT 'bench-' || k FROM generate_series(0, $1 - 1) AS k",
        )
        .bind::<BigInt, _>(keys)
        .execute(conn)?;
        diesel::sql_query(
            "INSERT INTO jobs (kind, payload, concurrency_key, has_dependents) \
             SELECT 'noop', '{}'::jsonb, 'bench-' || (g % $2), false \
             FROM generate_series(1, $1) AS g",
        )
        .bind::<BigInt, _>(i64::try_from(n).unwrap_or(i64::MAX))
        .bind::<BigInt, _>(keys)
        .execute(conn)
        .map(drop)
    })
}

/// Empties `tables`, the done-jobs archive and the live claims, runs `insert` in one
/// transaction with fresh statistics and a NOTIFY for `kind`, and returns the
/// database's clock once it committed, with the WAL position and the table
/// counters just before and just after.
pub(super) fn enqueue_timed(
    conn: &mut PgConnection,
    tables: &str,
    kind: &str,
    insert: impl FnOnce(&mut PgConnection) -> diesel::QueryResult<()>,
) -> anyhow::Result<stats::EnqueueMarks> {
    #[derive(QueryableByName)]
    struct Now {
        #[diesel(sql_type = diesel::sql_types::Timestamptz)]
        now: chrono::DateTime<chrono::Utc>,
    }
    diesel::sql_query(format!("TRUNCATE {tables}, jobs_done, job_claims")).execute(conn)?;
    // Today's and tomorrow's partitions exist before the first job finishes,
    // so no done job lands in the default partition (and a drain across
    // midnight finds its next day too).
    outbox_core::statements::ensure_done_partitions(conn)?;
    // Start from a clean table: no dead tuples left by the previous run.
    diesel::sql_query("VACUUM jobs").execute(conn)?;
    let lsn_before = stats::wal_lsn(conn)?;
    let tables_before = stats::read_tables(conn)?;
    conn.transaction(|conn| {
        insert(conn)?;
        // Statistics for the new rows, in the same transaction (ANALYZE samples
        // rows its own transaction inserted), so that no drain starts on a
        // planner that has never seen the table; autovacuum would get there too,
        // but not within one timed run.
        diesel::sql_query("ANALYZE jobs").execute(conn)?;
        diesel::sql_query("SELECT pg_notify('outbox_jobs', $1)")
            .bind::<diesel::sql_types::Text, _>(kind)
            .execute(conn)?;
        // This backend's counts of the inserts are published when this
        // transaction ends, before the snapshot that opens the drain.
        diesel::sql_query("SELECT pg_stat_force_next_flush()").execute(conn)?;
        diesel::QueryResult::Ok(())
    })?;
    let now: Now = diesel::sql_query("SELECT clock_timestamp() AS now").get_result(conn)?;
    let lsn_after = stats::wal_lsn(conn)?;
    let tables_after = stats::read_tables(conn)?;
    Ok(stats::EnqueueMarks {
        committed_at: now.now,
        lsn_before,
        lsn_after,
        tables_before,
        tables_after,
    })
}

/// Seconds from `start` to the last `finished_at`, both by the database's
/// clock. Done jobs may have left `jobs` for `jobs_done`: read both.
pub(super) fn drain_seconds(
    conn: &mut PgConnection,
    start: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<f64> {
    use diesel::sql_types::{Double, Nullable, Timestamptz};
    #[derive(QueryableByName)]
    struct Elapsed {
        #[diesel(sql_type = Nullable<Double>)]
        seconds: Option<f64>,
    }
    let row: Elapsed = diesel::sql_query(
        "SELECT extract(epoch FROM max(finished_at) - $1)::float8 AS seconds FROM jobs_all",
    )
    .bind::<Timestamptz, _>(start)
    .get_result(conn)?;
    row.seconds
        .context("no job has a finished_at: nothing was drained")
}

/// True once no job is pending or processing.
///
/// Unfinished jobs are the ones with finished_at IS NULL (bench jobs are
/// never blocked). The probe walks the primary key backwards: jobs are
/// claimed in enqueue order, so while the drain runs the newest job is still
/// unfinished and the probe stops at the first entry, instead of stepping
/// over every finished job's entry from the front, which a pinned horizon
/// keeps from being cleaned away. Not the claim's index: its predicate also
/// leaves out keyed and waiting jobs, so this filter does not imply it, and
/// the planner would read the whole table and sort it, ten times a second,
/// during the relay's drain only (the ceiling's loops never poll): the
/// bench's cost, charged to the relay.
pub(super) fn drained(conn: &mut PgConnection) -> anyhow::Result<bool> {
    use diesel::sql_types::Bool;
    #[derive(QueryableByName)]
    struct Busy {
        #[diesel(sql_type = Bool)]
        busy: bool,
    }
    let row: Busy = diesel::sql_query(
        // Not EXISTS: the planner drops an EXISTS subquery's ORDER BY.
        "SELECT count(*) > 0 AS busy FROM ( \
             SELECT 1 FROM jobs WHERE finished_at IS NULL AND NOT blocked \
             ORDER BY id DESC LIMIT 1) AS tail",
    )
    .get_result(conn)?;
    Ok(!row.busy)
}
