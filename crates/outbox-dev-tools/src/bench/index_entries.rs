//! How many index entries a bench job costs: the indexes each version of it
//! falls into, read from the catalogue's partial predicates, and, where
//! pg_walinspect is installed, the btree leaf insertions the WAL recorded.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Jsonb, Nullable, Text};

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
