//! The queue core standing on its own: its migrations build a database the
//! relay runs on without any of the order service's tables, and the service's
//! migration, run after them, changes the queue's schema only by its
//! `order_id`.

use std::collections::BTreeSet;

use diesel::prelude::*;
use diesel::sql_types::Text;

use crate::support::TestDb;

#[path = "../../examples/typed_job.rs"]
#[allow(dead_code, unreachable_pub)]
mod example;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typed_job_example_runs_a_kind_of_its_own_on_the_cores_tables_alone() {
    let db = TestDb::empty();

    let report = example::run(&db.url).await.expect("the example runs");

    assert_eq!(report.status, "done");
    assert_eq!(report.welcomes, 1, "the worker's commit hook wrote once");
    let mut conn = db.conn();
    let tables = catalog(&mut conn, TABLES);
    assert!(tables.contains("jobs") && tables.contains("jobs_done"));
    assert!(
        !tables
            .iter()
            .any(|t| t.contains("order") || t == "receipts"),
        "the core's migrations made no table of the order service: {tables:?}"
    );
}

#[path = "../../examples/periodic_and_scheduled.rs"]
#[allow(dead_code, unreachable_pub)]
mod time_example;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_time_example_cancels_a_reminder_and_two_relays_sweep_once_a_slot() {
    let db = TestDb::empty();

    let report = time_example::run(&db.url).await.expect("the example runs");

    assert_eq!(
        report.cancel,
        order_service::outbox::CancelOutcome::Cancelled
    );
    assert_eq!(
        report.reminders,
        ("done".to_owned(), "cancelled".to_owned())
    );
    let (sweeps, slots) = report.sweeps;
    assert!(sweeps >= 2, "three seconds of a one-second sweep: {sweeps}");
    assert_eq!(sweeps, slots, "two relays, one job a slot");
}

/// Column, constraint, index, view and function definitions, one line each,
/// of the relations the queue owns.
const TABLES: &str = "SELECT c.relname AS line FROM pg_class AS c
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
      AND c.relname <> '__diesel_schema_migrations'";
const COLUMNS: &str = "SELECT format('%s.%s %s %s %s', table_name, column_name, data_type,
        is_nullable, coalesce(column_default, '')) AS line
    FROM information_schema.columns
    WHERE table_schema = 'public' AND table_name IN ('jobs', 'jobs_done', 'jobs_all')";
const CONSTRAINTS: &str = "SELECT format('%s %s', conname, pg_get_constraintdef(oid)) AS line
    FROM pg_constraint WHERE conrelid IN ('jobs'::regclass, 'jobs_done'::regclass)";
const INDEXES: &str = "SELECT indexdef AS line FROM pg_indexes
    WHERE schemaname = 'public' AND tablename IN ('jobs', 'jobs_done')";
const FUNCTIONS: &str = "SELECT format('%s %s', p.proname, p.prosrc) AS line
    FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace
    WHERE n.nspname = 'public' AND p.proname LIKE 'jobs_done_%'";
const OPTIONS: &str = "SELECT format('%s %s', relname, array_to_string(reloptions, ',')) AS line
    FROM pg_class WHERE relname IN ('jobs', 'jobs_done')";

#[derive(QueryableByName)]
struct Line {
    #[diesel(sql_type = Text)]
    line: String,
}

fn catalog(conn: &mut PgConnection, query: &str) -> BTreeSet<String> {
    diesel::sql_query(query)
        .load::<Line>(conn)
        .expect("catalog query")
        .into_iter()
        .map(|l| l.line)
        .collect()
}

#[test]
fn the_services_migration_adds_only_its_order_id_to_the_queue_schema() {
    let core = TestDb::empty();
    let mut core_conn = core.conn();
    order_service::outbox_core::db::run_migrations(&mut core_conn).expect("core migrations");
    let service = TestDb::new();
    let mut service_conn = service.conn();

    for query in [COLUMNS, CONSTRAINTS, INDEXES, FUNCTIONS, OPTIONS] {
        let core_lines = catalog(&mut core_conn, query);
        // The service's own additions to the queue's tables: the order
        // column, its foreign key and indexes.
        let service_lines: BTreeSet<String> = catalog(&mut service_conn, query)
            .into_iter()
            .filter(|line| !line.contains("order_id"))
            .collect();
        assert_eq!(
            core_lines
                .symmetric_difference(&service_lines)
                .collect::<Vec<_>>(),
            Vec::<&String>::new(),
            "the core's and the service's queue schema differ ({query})"
        );
    }
}
