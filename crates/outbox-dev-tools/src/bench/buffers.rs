//! Where a drain's pages came from: `jobs`' heap and index buffers found in
//! shared buffers (hits) or read from outside them (reads: the kernel's page
//! cache or the disk), and the full-page images its WAL carried. A drain
//! that slows as the data grows reads more pages per job, or the same pages
//! from further away; these counters say which.

use diesel::prelude::*;
use diesel::sql_types::BigInt;
use serde_json::json;

use super::stats::finite;

/// Cumulative counters, read before and after a run.
#[derive(Debug, Clone, Copy, Default, QueryableByName)]
pub struct BufferCounters {
    #[diesel(sql_type = BigInt)]
    heap_hit: i64,
    #[diesel(sql_type = BigInt)]
    heap_read: i64,
    #[diesel(sql_type = BigInt)]
    idx_hit: i64,
    #[diesel(sql_type = BigInt)]
    idx_read: i64,
    /// Rows of `jobs` read by sequential scans.
    #[diesel(sql_type = BigInt)]
    seq_read: i64,
    /// Rows moved into `jobs_done`, all partitions: the jobs finished.
    #[diesel(sql_type = BigInt)]
    done: i64,
    /// Server-wide: run on a quiet server.
    #[diesel(sql_type = BigInt)]
    wal_fpi: i64,
    #[diesel(sql_type = BigInt)]
    checkpoints: i64,
}

/// Reads the counters, once every other backend of this database has exited
/// (a backend publishes its counts at most once a second while busy, and at
/// exit), waiting up to five seconds for them to go.
pub fn read(conn: &mut PgConnection) -> QueryResult<BufferCounters> {
    #[derive(QueryableByName)]
    struct Others {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let others: Others = diesel::sql_query(
            "SELECT count(*) AS n FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .get_result(conn)?;
        if others.n == 0 || std::time::Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    diesel::sql_query("SELECT pg_stat_clear_snapshot()").execute(conn)?;
    let checkpoints = super::stats::background(conn)?.checkpoints;
    let mut counters: BufferCounters = diesel::sql_query(
        "SELECT coalesce(io.heap_blks_hit, 0)::int8 AS heap_hit, \
                coalesce(io.heap_blks_read, 0)::int8 AS heap_read, \
                coalesce(io.idx_blks_hit, 0)::int8 AS idx_hit, \
                coalesce(io.idx_blks_read, 0)::int8 AS idx_read, \
                (SELECT coalesce(seq_tup_read, 0) FROM pg_stat_user_tables \
                 WHERE relid = 'jobs'::regclass)::int8 AS seq_read, \
                (SELECT coalesce(sum(s.n_tup_ins), 0)::int8 \
                 FROM pg_partition_tree('jobs_done') AS t \
                 JOIN pg_stat_user_tables AS s ON s.relid = t.relid WHERE t.isleaf) AS done, \
                (SELECT wal_fpi FROM pg_stat_wal)::int8 AS wal_fpi, \
                0::int8 AS checkpoints \
         FROM pg_statio_user_tables AS io WHERE io.relid = 'jobs'::regclass",
    )
    .get_result(conn)?;
    counters.checkpoints = checkpoints;
    Ok(counters)
}

/// Per job finished between two reads.
#[derive(Debug, Clone, Copy, Default)]
pub struct DrainBuffers {
    pub jobs: i64,
    pub heap_hit: f64,
    pub heap_read: f64,
    pub idx_hit: f64,
    pub idx_read: f64,
    pub wal_fpi: f64,
    pub seq_read: f64,
    pub checkpoints: i64,
}

impl DrainBuffers {
    pub fn between(before: BufferCounters, after: BufferCounters) -> DrainBuffers {
        let jobs = after.done - before.done;
        let per = |a: i64, b: i64| (a - b) as f64 / jobs.max(1) as f64;
        DrainBuffers {
            jobs,
            heap_hit: per(after.heap_hit, before.heap_hit),
            heap_read: per(after.heap_read, before.heap_read),
            idx_hit: per(after.idx_hit, before.idx_hit),
            idx_read: per(after.idx_read, before.idx_read),
            wal_fpi: per(after.wal_fpi, before.wal_fpi),
            seq_read: per(after.seq_read, before.seq_read),
            checkpoints: after.checkpoints - before.checkpoints,
        }
    }

    pub fn line(&self) -> String {
        format!(
            "per job: heap {:.2} hit + {:.2} read, indexes {:.2} hit + {:.2} read, {:.2} full-page images, \
             {:.1} rows read by sequential scans; {} checkpoints ({} jobs)",
            self.heap_hit,
            self.heap_read,
            self.idx_hit,
            self.idx_read,
            self.wal_fpi,
            self.seq_read,
            self.checkpoints,
            self.jobs
        )
    }

    pub fn json(&self) -> serde_json::Value {
        json!({
            "jobs": self.jobs,
            "heap_hit_per_job": finite(self.heap_hit),
            "heap_read_per_job": finite(self.heap_read),
            "idx_hit_per_job": finite(self.idx_hit),
            "idx_read_per_job": finite(self.idx_read),
            "wal_fpi_per_job": finite(self.wal_fpi),
            "seq_rows_read_per_job": finite(self.seq_read),
            "checkpoints": self.checkpoints,
        })
    }
}
