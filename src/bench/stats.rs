//! Server-side costs: transactions and WAL bytes, from PostgreSQL's statistics.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};

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
