//! Retention of done jobs: the daily partitions of `jobs_done`, what
//! `jobs_done_ensure_partitions` makes and what `prune_done_jobs` drops.

use order_service::orders::order_enqueuer;
use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use order_service::orders::place_order;
use order_service::outbox::{PruneReport, count_prunable, prune_done_jobs};

use crate::support::{TestDb, make_done, sample_order};

const WEEK: Duration = Duration::from_secs(7 * 86_400);

#[derive(QueryableByName, Debug, PartialEq)]
struct Located {
    #[diesel(sql_type = BigInt)]
    id: i64,
    /// The partition of `jobs_done` holding the row.
    #[diesel(sql_type = Text)]
    partition: String,
}

/// Where each archived job lives, by id.
fn archived(conn: &mut PgConnection) -> Vec<Located> {
    diesel::sql_query("SELECT id, tableoid::regclass::text AS partition FROM jobs_done ORDER BY id")
        .load(conn)
        .expect("jobs_done")
}

/// The name of the partition for the UTC day `days` days ago.
fn partition_of_day(conn: &mut PgConnection, days: i32) -> String {
    #[derive(QueryableByName)]
    struct Name {
        #[diesel(sql_type = Text)]
        name: String,
    }
    diesel::sql_query(format!(
        "SELECT 'jobs_done_' || to_char((now() AT TIME ZONE 'UTC')::date - {days}, 'YYYYMMDD') AS name"
    ))
    .get_result::<Name>(conn)
    .expect("partition name")
    .name
}

fn exists(conn: &mut PgConnection, relation: &str) -> bool {
    #[derive(QueryableByName)]
    struct Found {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        found: bool,
    }
    diesel::sql_query("SELECT to_regclass($1) IS NOT NULL AS found")
        .bind::<Text, _>(relation)
        .get_result::<Found>(conn)
        .expect("to_regclass")
        .found
}

fn ensure_partitions_since(conn: &mut PgConnection, days_ago: i32) {
    diesel::sql_query(format!(
        "SELECT jobs_done_ensure_partitions(now() - interval '{days_ago} days', 2)"
    ))
    .execute(conn)
    .expect("ensure partitions");
}

/// Places one order and returns its three job ids.
fn three_jobs(conn: &mut PgConnection) -> [i64; 3] {
    use order_service::schema::jobs;
    let order_id = place_order(conn, &order_enqueuer(), &sample_order(), None, 8)
        .expect("place order")
        .order_id();
    let ids: Vec<i64> = jobs::table
        .filter(jobs::order_id.eq(order_id))
        .order(jobs::id)
        .select(jobs::id)
        .load(conn)
        .expect("jobs");
    ids.try_into().expect("three jobs")
}

#[test]
fn prune_drops_a_whole_old_partition_and_leaves_younger_ones() {
    let db = TestDb::new();
    let mut conn = db.conn();
    ensure_partitions_since(&mut conn, 10);
    let [old_a, old_b, young] = three_jobs(&mut conn);
    make_done(
        &mut conn,
        &format!("id IN ({old_a}, {old_b})"),
        "now() - interval '10 days'",
    );
    make_done(
        &mut conn,
        &format!("id = {young}"),
        "now() - interval '2 days'",
    );
    let old_day = partition_of_day(&mut conn, 10);
    let young_day = partition_of_day(&mut conn, 2);
    assert_eq!(
        archived(&mut conn),
        [
            Located {
                id: old_a,
                partition: old_day.clone()
            },
            Located {
                id: old_b,
                partition: old_day.clone()
            },
            Located {
                id: young,
                partition: young_day.clone()
            },
        ],
        "each done job is in its day's partition"
    );
    assert_eq!(count_prunable(&mut conn, WEEK), Ok(2));

    let mut seen = Vec::new();
    let report = prune_done_jobs(&mut conn, WEEK, 1000, |n| seen.push(n)).expect("prune");

    assert_eq!(report.deleted, 2);
    assert_eq!(report.batches, 0, "nothing was deleted row by row");
    assert!(
        report.partitions_dropped >= 3,
        "the days 10, 9 and 8 days ago are wholly older than a week: {report:?}"
    );
    assert_eq!(report.partitions_busy, 0);
    assert_eq!(seen.last(), Some(&2), "progress reached the total");
    assert!(!exists(&mut conn, &old_day), "{old_day} was dropped");
    assert!(exists(&mut conn, &young_day), "{young_day} stays");
    let week_ago = partition_of_day(&mut conn, 7);
    assert!(
        exists(&mut conn, &week_ago),
        "the day 7 days ago is not wholly older than a week: kept up to a day more"
    );
    assert_eq!(
        archived(&mut conn),
        [Located {
            id: young,
            partition: young_day
        }],
        "nothing is left of the old jobs, the young one stays"
    );
    assert_eq!(count_prunable(&mut conn, WEEK), Ok(0));
}

#[test]
fn prune_deletes_old_rows_of_the_default_partition_in_batches() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let ids = three_jobs(&mut conn);
    // No partition exists for a day 30 days ago: the rows land in the default.
    make_done(&mut conn, "true", "now() - interval '30 days'");
    assert!(
        archived(&mut conn)
            .iter()
            .all(|j| j.partition == "jobs_done_default"),
        "{:?}",
        archived(&mut conn)
    );

    let report = prune_done_jobs(&mut conn, WEEK, 2, |_| {}).expect("prune");

    assert_eq!(
        (report.deleted, report.batches),
        (3, 2),
        "3 rows in batches of 2: {report:?}"
    );
    assert!(archived(&mut conn).is_empty(), "{ids:?} are gone");
}

#[test]
fn prune_completes_under_a_pinned_horizon() {
    let db = TestDb::new();
    let mut conn = db.conn();
    ensure_partitions_since(&mut conn, 10);
    let [a, b, c] = three_jobs(&mut conn);
    make_done(
        &mut conn,
        &format!("id IN ({a}, {b})"),
        "now() - interval '10 days'",
    );
    make_done(
        &mut conn,
        &format!("id = {c}"),
        "now() - interval '40 days'",
    );
    // Another session holds a snapshot (as a long report or a lagging replica
    // would), so no row deleted from now on can be vacuumed away. It has read
    // nothing of jobs_done, so it holds no lock a drop must wait for.
    let mut pinning = db.conn();
    diesel::sql_query("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut pinning)
        .expect("begin");
    diesel::sql_query("SELECT count(*) FROM orders")
        .execute(&mut pinning)
        .expect("take the snapshot");

    let url = db.url.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut conn = PgConnection::establish(&url).expect("connect");
        let _ = tx.send(prune_done_jobs(&mut conn, WEEK, 1, |_| {}));
    });
    let report: PruneReport = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("prune finishes while the horizon is pinned")
        .expect("prune");

    assert_eq!(report.deleted, 3, "{report:?}");
    assert_eq!(
        report.batches, 1,
        "the stray row of 40 days ago: {report:?}"
    );
    assert!(report.partitions_dropped >= 3, "{report:?}");
    assert!(archived(&mut conn).is_empty());
    #[derive(QueryableByName)]
    struct Pinned {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        pinned: bool,
    }
    let pinned: Pinned = diesel::sql_query(
        "SELECT backend_xmin IS NOT NULL AS pinned FROM pg_stat_activity \
         WHERE pid <> pg_backend_pid() AND datname = current_database() \
           AND state = 'idle in transaction'",
    )
    .get_result(&mut conn)
    .expect("the pinning session");
    assert!(pinned.pinned, "the horizon was pinned throughout");
    diesel::sql_query("COMMIT")
        .execute(&mut pinning)
        .expect("commit");
}

#[test]
fn ensure_partitions_moves_rows_out_of_the_default_partition_when_it_makes_their_day() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let [a, b, c] = three_jobs(&mut conn);
    make_done(
        &mut conn,
        &format!("id IN ({a}, {b})"),
        "now() - interval '20 days'",
    );
    make_done(
        &mut conn,
        &format!("id = {c}"),
        "now() - interval '40 days'",
    );
    assert!(
        archived(&mut conn)
            .iter()
            .all(|j| j.partition == "jobs_done_default")
    );

    ensure_partitions_since(&mut conn, 20);

    let day = partition_of_day(&mut conn, 20);
    assert_eq!(
        archived(&mut conn),
        [
            Located {
                id: a,
                partition: day.clone()
            },
            Located {
                id: b,
                partition: day
            },
            Located {
                id: c,
                partition: "jobs_done_default".into()
            },
        ],
        "the rows of the new day moved to it; an older day's row stays in the default"
    );
}
