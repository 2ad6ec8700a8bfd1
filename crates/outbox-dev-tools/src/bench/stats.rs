//! Server-side costs: transactions and WAL bytes, from PostgreSQL's statistics,
//! and what each job costs the tables it passes through (WAL, index entries,
//! HOT updates, buffers, dead tuples). The index entries are counted in
//! `index_entries.rs`.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Text};

use super::index_entries::{IndexLayout, done_in_place, index_entries_from_wal, index_layout};

#[derive(Debug, Clone, Copy, Default)]
pub struct ServerCounters {
    pub transactions: i64,
    pub wal_bytes: i64,
}

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = BigInt)]
    transactions: i64,
    #[diesel(sql_type = BigInt)]
    wal_bytes: i64,
}

/// Reads the counters of database `name`. Other backends publish their
/// statistics when they exit or go idle, so read this after the measured
/// connections are closed.
pub fn read(conn: &mut PgConnection, name: &str) -> QueryResult<ServerCounters> {
    diesel::sql_query("SELECT pg_stat_clear_snapshot()").execute(conn)?;
    let row: Row = diesel::sql_query(
        "SELECT (SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1)::bigint AS transactions, \
                (SELECT wal_bytes FROM pg_stat_wal)::bigint AS wal_bytes",
    )
    .bind::<Text, _>(name)
    .get_result(conn)?;
    Ok(ServerCounters {
        transactions: row.transactions,
        wal_bytes: row.wal_bytes,
    })
}

impl std::ops::Sub for ServerCounters {
    type Output = ServerCounters;
    fn sub(self, rhs: ServerCounters) -> ServerCounters {
        ServerCounters {
            transactions: self.transactions - rhs.transactions,
            wal_bytes: self.wal_bytes - rhs.wal_bytes,
        }
    }
}

/// The WAL insert position, as text (`pg_lsn` has no Diesel type).
pub fn wal_lsn(conn: &mut PgConnection) -> QueryResult<String> {
    #[derive(QueryableByName)]
    struct Lsn {
        #[diesel(sql_type = Text)]
        lsn: String,
    }
    let row: Lsn =
        diesel::sql_query("SELECT pg_current_wal_lsn()::text AS lsn").get_result(conn)?;
    Ok(row.lsn)
}

/// Bytes of WAL between two positions from [`wal_lsn`]. The server's WAL is
/// shared by every database on it, so another client's writes in the same
/// window count too: run the bench on a quiet server.
pub fn wal_bytes_between(conn: &mut PgConnection, from: &str, to: &str) -> QueryResult<i64> {
    #[derive(QueryableByName)]
    struct Diff {
        #[diesel(sql_type = BigInt)]
        bytes: i64,
    }
    let row: Diff =
        diesel::sql_query("SELECT pg_wal_lsn_diff($2::pg_lsn, $1::pg_lsn)::bigint AS bytes")
            .bind::<Text, _>(from)
            .bind::<Text, _>(to)
            .get_result(conn)?;
    Ok(row.bytes)
}

/// Cumulative counters of `jobs` and of every partition of `jobs_done`
/// (summed), from pg_stat_user_tables and pg_statio_user_tables.
#[derive(Debug, Clone, Copy, Default, QueryableByName)]
pub struct TableCounters {
    #[diesel(sql_type = BigInt)]
    pub jobs_ins: i64,
    #[diesel(sql_type = BigInt)]
    pub jobs_upd: i64,
    #[diesel(sql_type = BigInt)]
    pub jobs_hot_upd: i64,
    #[diesel(sql_type = BigInt)]
    pub jobs_del: i64,
    /// Not cumulative: dead row versions in `jobs` now (vacuum lowers it).
    #[diesel(sql_type = BigInt)]
    pub jobs_dead: i64,
    /// Buffer accesses (hits and reads) of `jobs`' heap, and of all its indexes.
    #[diesel(sql_type = BigInt)]
    pub jobs_heap_blks: i64,
    #[diesel(sql_type = BigInt)]
    pub jobs_idx_blks: i64,
    #[diesel(sql_type = BigInt)]
    pub done_ins: i64,
}

/// Reads [`TableCounters`]. Each backend publishes its counts at most once a
/// second while busy and at exit, so a delta is exact only once the backends
/// that did the work have exited; this backend's own are flushed first.
pub fn read_tables(conn: &mut PgConnection) -> QueryResult<TableCounters> {
    diesel::sql_query("SELECT pg_stat_force_next_flush()").execute(conn)?;
    // The forced flush happens when that statement's transaction ends; the
    // snapshot of the statistics is cleared so the next read sees it.
    diesel::sql_query("SELECT pg_stat_clear_snapshot()").execute(conn)?;
    diesel::sql_query(
        "WITH done AS ( \
             SELECT coalesce(sum(s.n_tup_ins), 0)::bigint AS ins \
             FROM pg_partition_tree('jobs_done') AS t \
             JOIN pg_stat_user_tables AS s ON s.relid = t.relid \
             WHERE t.isleaf) \
         SELECT s.n_tup_ins AS jobs_ins, s.n_tup_upd AS jobs_upd, \
                s.n_tup_hot_upd AS jobs_hot_upd, s.n_tup_del AS jobs_del, \
                s.n_dead_tup AS jobs_dead, \
                (coalesce(io.heap_blks_hit, 0) + coalesce(io.heap_blks_read, 0))::bigint AS jobs_heap_blks, \
                (coalesce(io.idx_blks_hit, 0) + coalesce(io.idx_blks_read, 0))::bigint AS jobs_idx_blks, \
                done.ins AS done_ins \
         FROM pg_stat_user_tables AS s \
         JOIN pg_statio_user_tables AS io ON io.relid = s.relid, done \
         WHERE s.relid = 'jobs'::regclass",
    )
    .get_result(conn)
}

impl std::ops::Sub for TableCounters {
    type Output = TableCounters;
    fn sub(self, rhs: TableCounters) -> TableCounters {
        TableCounters {
            jobs_ins: self.jobs_ins - rhs.jobs_ins,
            jobs_upd: self.jobs_upd - rhs.jobs_upd,
            jobs_hot_upd: self.jobs_hot_upd - rhs.jobs_hot_upd,
            jobs_del: self.jobs_del - rhs.jobs_del,
            // A gauge: the delta of a gauge says nothing, keep the later value.
            jobs_dead: self.jobs_dead,
            jobs_heap_blks: self.jobs_heap_blks - rhs.jobs_heap_blks,
            jobs_idx_blks: self.jobs_idx_blks - rhs.jobs_idx_blks,
            done_ins: self.done_ins - rhs.done_ins,
        }
    }
}

/// Index entries written, estimated from the row counters and the layout:
///
///   jobs inserts × (indexes an enqueued job is in)
/// + in-place finishes × (indexes a done version is in)
/// + other non-HOT updates of jobs (claims) × (indexes a claimed version is in)
/// + jobs_done inserts × (per-row indexes of a jobs_done partition)
///
/// A HOT update adds no index entry (that is what HOT is) and a DELETE adds
/// none; a non-HOT update adds an entry to every index the new version
/// satisfies. An in-place finish changes finished_at, which partial
/// predicates mention, so it is never HOT; `done_in_place` is the number of
/// jobs left done in `jobs` after the drain (0 once finishes move rows out).
pub fn index_entries_estimate(
    delta: &TableCounters,
    layout: &IndexLayout,
    done_in_place: i64,
) -> i64 {
    let non_hot = (delta.jobs_upd - delta.jobs_hot_upd).max(0);
    let in_place = done_in_place.min(non_hot);
    delta.jobs_ins * layout.inserted
        + in_place * layout.done_in_place
        + (non_hot - in_place) * layout.claimed
        + delta.done_ins * layout.archived
}

/// Per-job database cost of one drain (enqueue and drain phases together,
/// except where a field says otherwise).
#[derive(Debug, Clone)]
pub struct DbCost {
    pub jobs: usize,
    /// WAL bytes between the positions before and after the enqueue's
    /// transaction, and from there to the end of the drain.
    pub wal_enqueue_bytes: i64,
    pub wal_drain_bytes: i64,
    /// Row counters over enqueue and drain.
    pub tables: TableCounters,
    /// Buffer accesses of `jobs` over the drain alone (claims, finishes and
    /// the bench's own polls).
    pub drain_heap_blks: i64,
    pub drain_idx_blks: i64,
    /// n_dead_tup of `jobs` when the drain started and after it ended.
    pub dead_before: i64,
    pub dead_after: i64,
    pub layout: IndexLayout,
    pub done_in_place: i64,
    pub index_entries_estimate: i64,
    /// From the WAL, per index, when pg_walinspect could read it.
    pub index_entries_wal: Option<Vec<(String, i64)>>,
}

impl DbCost {
    fn per_job(&self, n: i64) -> f64 {
        n as f64 / self.jobs.max(1) as f64
    }
    pub fn wal_enqueue_per_job(&self) -> f64 {
        self.per_job(self.wal_enqueue_bytes)
    }
    pub fn wal_drain_per_job(&self) -> f64 {
        self.per_job(self.wal_drain_bytes)
    }
    pub fn index_entries_per_job_estimate(&self) -> f64 {
        self.per_job(self.index_entries_estimate)
    }
    pub fn index_entries_per_job_wal(&self) -> Option<f64> {
        self.index_entries_wal
            .as_ref()
            .map(|rows| self.per_job(rows.iter().map(|(_, n)| n).sum()))
    }
    /// HOT updates of `jobs` over all its updates (NaN when nothing updated it).
    pub fn hot_share(&self) -> f64 {
        if self.tables.jobs_upd > 0 {
            self.tables.jobs_hot_upd as f64 / self.tables.jobs_upd as f64
        } else {
            f64::NAN
        }
    }
    pub fn heap_blks_per_job(&self) -> f64 {
        self.per_job(self.drain_heap_blks)
    }
    pub fn idx_blks_per_job(&self) -> f64 {
        self.per_job(self.drain_idx_blks)
    }
}

/// Where a drain stood when its jobs became visible: the snapshots a
/// [`DbCost`] is the difference of.
#[derive(Debug, Clone)]
pub struct EnqueueMarks {
    /// The database's clock at the enqueue's commit.
    pub committed_at: chrono::DateTime<chrono::Utc>,
    pub lsn_before: String,
    pub lsn_after: String,
    pub tables_before: TableCounters,
    pub tables_after: TableCounters,
}

/// The cost of a drain that started at `marks` and has just ended (the
/// backends that worked it closed, so their statistics are published).
pub fn db_cost(conn: &mut PgConnection, jobs: usize, marks: &EnqueueMarks) -> QueryResult<DbCost> {
    let lsn_end = wal_lsn(conn)?;
    let end = read_tables(conn)?;
    let layout = index_layout(conn)?;
    let done_in_place = done_in_place(conn)?;
    let tables = end - marks.tables_before;
    let drain = end - marks.tables_after;
    Ok(DbCost {
        jobs,
        wal_enqueue_bytes: wal_bytes_between(conn, &marks.lsn_before, &marks.lsn_after)?,
        wal_drain_bytes: wal_bytes_between(conn, &marks.lsn_after, &lsn_end)?,
        index_entries_estimate: index_entries_estimate(&tables, &layout, done_in_place),
        tables,
        drain_heap_blks: drain.jobs_heap_blks,
        drain_idx_blks: drain.jobs_idx_blks,
        dead_before: marks.tables_after.jobs_dead,
        dead_after: end.jobs_dead,
        layout,
        done_in_place,
        index_entries_wal: index_entries_from_wal(conn, &marks.lsn_before, &lsn_end),
    })
}

/// A float the JSON line can carry (NaN and infinities become null).
pub fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

/// The server's background work that can stall a run: checkpoints (and the
/// buffers they wrote) and autovacuum / autoanalyze passes over `jobs`.
/// Read before and after a run, the difference says whether one ran in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Background {
    pub checkpoints: i64,
    pub checkpoint_buffers: i64,
    pub jobs_autovacuums: i64,
    pub jobs_autoanalyzes: i64,
}

impl Background {
    /// What happened between `before` and `self`.
    pub fn since(self, before: Background) -> Background {
        Background {
            checkpoints: self.checkpoints - before.checkpoints,
            checkpoint_buffers: self.checkpoint_buffers - before.checkpoint_buffers,
            jobs_autovacuums: self.jobs_autovacuums - before.jobs_autovacuums,
            jobs_autoanalyzes: self.jobs_autoanalyzes - before.jobs_autoanalyzes,
        }
    }
}

/// The counters now. PostgreSQL 17 moved the checkpoint counters from
/// `pg_stat_bgwriter` to `pg_stat_checkpointer`; whichever exists is read.
pub fn background(conn: &mut PgConnection) -> QueryResult<Background> {
    #[derive(QueryableByName)]
    struct Has {
        #[diesel(sql_type = Bool)]
        has: bool,
    }
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = BigInt)]
        checkpoints: i64,
        #[diesel(sql_type = BigInt)]
        checkpoint_buffers: i64,
        #[diesel(sql_type = BigInt)]
        autovacuums: i64,
        #[diesel(sql_type = BigInt)]
        autoanalyzes: i64,
    }
    let checkpointer: Has = diesel::sql_query(
        "SELECT to_regclass('pg_catalog.pg_stat_checkpointer') IS NOT NULL AS has",
    )
    .get_result(conn)?;
    let checkpoints = if checkpointer.has {
        "SELECT (num_timed + num_requested)::int8 AS c, buffers_written::int8 AS b FROM pg_stat_checkpointer"
    } else {
        "SELECT (checkpoints_timed + checkpoints_req)::int8 AS c, buffers_checkpoint::int8 AS b FROM pg_stat_bgwriter"
    };
    let row: Row = diesel::sql_query(format!(
        "SELECT cp.c AS checkpoints, cp.b AS checkpoint_buffers, \
                coalesce((SELECT autovacuum_count FROM pg_stat_all_tables WHERE relid = 'jobs'::regclass), 0)::int8 AS autovacuums, \
                coalesce((SELECT autoanalyze_count FROM pg_stat_all_tables WHERE relid = 'jobs'::regclass), 0)::int8 AS autoanalyzes \
         FROM ({checkpoints}) AS cp"
    ))
    .get_result(conn)?;
    Ok(Background {
        checkpoints: row.checkpoints,
        checkpoint_buffers: row.checkpoint_buffers,
        jobs_autovacuums: row.autovacuums,
        jobs_autoanalyzes: row.autoanalyzes,
    })
}

/// The name of the database `conn` is connected to, for its counters.
pub fn conn_database(conn: &mut PgConnection) -> anyhow::Result<String> {
    #[derive(QueryableByName)]
    struct Name {
        #[diesel(sql_type = diesel::sql_types::Text)]
        name: String,
    }
    let row: Name =
        diesel::sql_query("SELECT current_database()::text AS name").get_result(conn)?;
    Ok(row.name)
}
