//! Server-side costs: transactions and WAL bytes, from PostgreSQL's statistics,
//! and what each job costs the tables it passes through (WAL, index entries,
//! HOT updates, buffers, dead tuples).

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Jsonb, Nullable, Text};

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

/// How many btree (entry-per-row) indexes one version of a bench job falls
/// into, read from the catalogue: each index's partial predicate, if any, is
/// evaluated against that version. BRIN indexes are left out: a BRIN index
/// keeps one summary per block range, and a row costs it no entry of its own.
#[derive(Debug, Clone, Default)]
pub struct IndexLayout {
    /// `jobs` indexes a freshly enqueued bench job is in (no order, no key).
    pub inserted: i64,
    /// `jobs` indexes a claimed (processing) version is in.
    pub claimed: i64,
    /// `jobs` indexes a version marked done in place is in (the old write path).
    pub done_in_place: i64,
    /// Per-row indexes of the `jobs_done` partition a done job lands in.
    pub archived: i64,
    /// Every index of `jobs` and of `jobs_done`'s partitions, for the report.
    pub names: Vec<String>,
}

/// The versions of a bench job, as `jsonb_populate_record` input; columns
/// left out are NULL (no order_id, no ordering_key, no finished_at); a job
/// without parents waits on nothing (`waiting_on` is `{}`, as the column's default).
const INSERTED: &str = r#"{"id":1,"kind":"noop","payload":{},"status":"pending","run_after":"2026-01-01T00:00:00Z","attempts":0,"max_attempts":8,"created_at":"2026-01-01T00:00:00Z","blocked":false,"waiting_on":[]}"#;
const CLAIMED: &str = r#"{"id":1,"kind":"noop","payload":{},"status":"processing","run_after":"2026-01-01T00:00:00Z","attempts":1,"max_attempts":8,"locked_by":"bench","locked_at":"2026-01-01T00:00:00Z","lease_expires_at":"2026-01-01T00:01:00Z","lease_token":1,"created_at":"2026-01-01T00:00:00Z","blocked":false,"waiting_on":[]}"#;
const DONE: &str = r#"{"id":1,"kind":"noop","payload":{},"status":"done","run_after":"2026-01-01T00:00:00Z","attempts":1,"max_attempts":8,"locked_by":"bench","locked_at":"2026-01-01T00:00:00Z","lease_token":1,"created_at":"2026-01-01T00:00:00Z","finished_at":"2026-01-01T00:00:01Z","blocked":false,"waiting_on":[]}"#;

pub fn index_layout(conn: &mut PgConnection) -> QueryResult<IndexLayout> {
    #[derive(QueryableByName)]
    struct Index {
        #[diesel(sql_type = Text)]
        table_name: String,
        #[diesel(sql_type = Text)]
        name: String,
        #[diesel(sql_type = Text)]
        method: String,
        #[diesel(sql_type = Nullable<Text>)]
        predicate: Option<String>,
    }
    let indexes: Vec<Index> = diesel::sql_query(
        "SELECT t.relname::text AS table_name, c.relname::text AS name, am.amname::text AS method, \
                pg_get_expr(i.indpred, i.indrelid) AS predicate \
         FROM pg_index AS i \
         JOIN pg_class AS c ON c.oid = i.indexrelid \
         JOIN pg_class AS t ON t.oid = i.indrelid \
         JOIN pg_am AS am ON am.oid = c.relam \
         WHERE i.indrelid = 'jobs'::regclass \
            OR i.indrelid IN (SELECT relid FROM pg_partition_tree('jobs_done') WHERE isleaf) \
         ORDER BY t.relname, c.relname",
    )
    .load(conn)?;
    let mut layout = IndexLayout::default();
    // Every leaf partition has the same indexes (they are the parent's):
    // count and name one.
    let leaf: Option<String> = indexes
        .iter()
        .map(|i| i.table_name.clone())
        .filter(|t| t != "jobs")
        .max();
    for index in &indexes {
        let per_row = index.method != "brin";
        if index.table_name != "jobs" && Some(&index.table_name) != leaf.as_ref() {
            continue;
        }
        layout.names.push(format!(
            "{}.{} ({}{})",
            index.table_name,
            index.name,
            index.method,
            index
                .predicate
                .as_deref()
                .map(|p| format!(" WHERE {p}"))
                .unwrap_or_default()
        ));
        if !per_row {
            continue;
        }
        if index.table_name == "jobs" {
            let holds = |conn: &mut PgConnection, version: &str| {
                predicate_holds(conn, "jobs", index.predicate.as_deref(), version)
            };
            layout.inserted += i64::from(holds(conn, INSERTED)?);
            layout.claimed += i64::from(holds(conn, CLAIMED)?);
            layout.done_in_place += i64::from(holds(conn, DONE)?);
        } else if Some(&index.table_name) == leaf.as_ref() {
            layout.archived += i64::from(predicate_holds(
                conn,
                "jobs_done",
                index.predicate.as_deref(),
                DONE,
            )?);
        }
    }
    Ok(layout)
}

/// Whether a partial index's predicate (none: every row) holds for `version`.
fn predicate_holds(
    conn: &mut PgConnection,
    table: &str,
    predicate: Option<&str>,
    version: &str,
) -> QueryResult<bool> {
    #[derive(QueryableByName)]
    struct Holds {
        #[diesel(sql_type = Nullable<Bool>)]
        holds: Option<bool>,
    }
    let Some(predicate) = predicate else {
        return Ok(true);
    };
    // The predicate is the catalogue's own text, over the table's columns
    // unqualified: a record of the table's type, aliased as the table, gives
    // it the columns it names.
    let row: Holds = diesel::sql_query(format!(
        "SELECT ({predicate}) AS holds FROM jsonb_populate_record(NULL::{table}, $1) AS {table}"
    ))
    .bind::<Jsonb, _>(serde_json::from_str::<serde_json::Value>(version).unwrap_or_default())
    .get_result(conn)?;
    // A NULL predicate leaves the row out of the index, like false.
    Ok(row.holds.unwrap_or(false))
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

/// Jobs left `done` in `jobs` itself (the write path before layout v2).
pub fn done_in_place(conn: &mut PgConnection) -> QueryResult<i64> {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let row: Count = diesel::sql_query(
        "SELECT count(*) AS n FROM jobs WHERE finished_at IS NOT NULL AND status = 'done'",
    )
    .get_result(conn)?;
    Ok(row.n)
}

/// Index entries counted from the WAL itself, when pg_walinspect can be
/// installed: every btree leaf insertion is one WAL record (INSERT_LEAF,
/// INSERT_POST, or the SPLIT_L / SPLIT_R that carries the new entry), and its
/// first block reference names the index's relfilenode. Returns the count for
/// the indexes of `jobs` and of jobs_done's partitions, by index name, or
/// `None` when the extension is missing or the WAL has been recycled.
pub fn index_entries_from_wal(
    conn: &mut PgConnection,
    from: &str,
    to: &str,
) -> Option<Vec<(String, i64)>> {
    #[derive(QueryableByName)]
    struct PerIndex {
        #[diesel(sql_type = Text)]
        name: String,
        #[diesel(sql_type = BigInt)]
        entries: i64,
    }
    diesel::sql_query("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        .execute(conn)
        .ok()?;
    // pg_walinspect reads only flushed WAL; the claims commit asynchronously,
    // so wait for the WAL writer (it flushes at least every 200 ms).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        #[derive(QueryableByName)]
        struct Flushed {
            #[diesel(sql_type = Bool)]
            flushed: bool,
        }
        let row: Flushed =
            diesel::sql_query("SELECT pg_current_wal_flush_lsn() >= $1::pg_lsn AS flushed")
                .bind::<Text, _>(to)
                .get_result(conn)
                .ok()?;
        if row.flushed {
            break;
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let rows: Vec<PerIndex> = diesel::sql_query(
        "WITH ours AS ( \
             SELECT CASE WHEN i.indrelid = 'jobs'::regclass THEN c.relname::text \
                         ELSE 'jobs_done partitions' END AS name, \
                    pg_relation_filenode(c.oid) AS filenode \
             FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid \
             WHERE i.indrelid = 'jobs'::regclass \
                OR i.indrelid IN (SELECT relid FROM pg_partition_tree('jobs_done') WHERE isleaf)), \
         leaf_inserts AS ( \
             SELECT (regexp_match(block_ref, 'rel \\d+/(\\d+)/(\\d+)'))::text[] AS rel \
             FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn) \
             WHERE resource_manager = 'Btree' \
               AND record_type IN ('INSERT_LEAF', 'INSERT_POST', 'SPLIT_L', 'SPLIT_R')) \
         SELECT ours.name, count(leaf_inserts.rel)::bigint AS entries \
         FROM ours \
         LEFT JOIN leaf_inserts \
           ON leaf_inserts.rel[1]::oid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
          AND leaf_inserts.rel[2]::oid = ours.filenode \
         GROUP BY ours.name ORDER BY ours.name",
    )
    .bind::<Text, _>(from)
    .bind::<Text, _>(to)
    .load(conn)
    .ok()?;
    Some(rows.into_iter().map(|r| (r.name, r.entries)).collect())
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
