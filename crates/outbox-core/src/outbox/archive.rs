//! Upkeep of `jobs_done`, the day-partitioned archive done jobs move to.

use diesel::prelude::*;
use diesel::sql_types::Integer;

/// How often a worker pool makes sure the coming days have their partitions.
pub(crate) const PARTITION_UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

/// Makes the daily partitions of `jobs_done` from yesterday through two days
/// ahead; returns how many it made. Idempotent, safe from many processes.
pub fn ensure_done_partitions(conn: &mut PgConnection) -> QueryResult<i32> {
    #[derive(QueryableByName)]
    struct Made {
        #[diesel(sql_type = Integer)]
        made: i32,
    }
    diesel::sql_query(include_str!("sql/ensure_done_partitions.sql"))
        .get_result::<Made>(conn)
        .map(|m| m.made)
}
