//! The Diesel schemas (the core's and the service's) against the database's
//! own catalog after every migration: a column added by a migration and
//! missing from `schema.rs`, or the other way round, fails here rather than
//! at the first query that needs it.

use std::collections::BTreeSet;

use diesel::prelude::*;
use diesel::sql_types::Text;

use crate::support::TestDb;

/// The columns Diesel selects for `table.select(all_columns)`, read from the
/// SQL it writes (`"table"."column", …`).
macro_rules! diesel_columns {
    ($($table:ident)::+) => {{
        let sql = diesel::debug_query::<diesel::pg::Pg, _>(
            &$($table)::+::table.select($($table)::+::all_columns),
        )
        .to_string();
        columns_in(&sql)
    }};
}

fn columns_in(sql: &str) -> BTreeSet<String> {
    let select = sql.split(" FROM ").next().unwrap_or_default();
    select
        .split(", ")
        .filter_map(|qualified| qualified.rsplit('.').next())
        .map(|column| column.trim().trim_matches('"').to_owned())
        .collect()
}

#[derive(QueryableByName)]
struct Column {
    #[diesel(sql_type = Text)]
    column_name: String,
}

fn catalog_columns(conn: &mut PgConnection, table: &str) -> BTreeSet<String> {
    diesel::sql_query(
        "SELECT column_name::text AS column_name FROM information_schema.columns \
         WHERE table_schema = current_schema() AND table_name = $1",
    )
    .bind::<Text, _>(table)
    .load::<Column>(conn)
    .expect("read the catalog")
    .into_iter()
    .map(|c| c.column_name)
    .collect()
}

#[test]
fn every_diesel_table_matches_the_database_catalog() {
    let db = TestDb::new();
    let mut conn = db.conn();
    use order_service::schema;
    let tables = [
        ("orders", diesel_columns!(schema::orders)),
        ("order_items", diesel_columns!(schema::order_items)),
        ("order_events", diesel_columns!(schema::order_events)),
        ("jobs", diesel_columns!(schema::jobs)),
        ("jobs_all", diesel_columns!(schema::jobs_all)),
        ("receipts", diesel_columns!(schema::receipts)),
        ("endpoints", diesel_columns!(schema::endpoints)),
        ("api_keys", diesel_columns!(schema::api_keys)),
        (
            "delivery_attempts",
            diesel_columns!(schema::delivery_attempts),
        ),
        ("sources", diesel_columns!(schema::sources)),
        ("inbox_messages", diesel_columns!(schema::inbox_messages)),
        (
            "source_reconciliations",
            diesel_columns!(schema::source_reconciliations),
        ),
    ];
    let mut drift = Vec::new();
    for (table, diesel) in tables {
        let catalog = catalog_columns(&mut conn, table);
        assert!(!catalog.is_empty(), "{table} is not in the database");
        let only_diesel: Vec<_> = diesel.difference(&catalog).collect();
        let only_catalog: Vec<_> = catalog.difference(&diesel).collect();
        if !only_diesel.is_empty() || !only_catalog.is_empty() {
            drift.push(format!(
                "{table}: in schema.rs only {only_diesel:?}, in the database only {only_catalog:?}"
            ));
        }
    }
    assert!(drift.is_empty(), "{}", drift.join("\n"));
}

#[test]
fn the_cores_jobs_columns_are_the_services_less_its_own() {
    let core = diesel_columns!(outbox_core::schema::jobs);
    let service = diesel_columns!(order_service::schema::jobs);
    let added: Vec<_> = service.difference(&core).collect();
    assert_eq!(
        added,
        ["order_id"],
        "the service adds order_id to the core's columns"
    );
    assert_eq!(
        diesel_columns!(outbox_core::schema::jobs_all),
        core,
        "jobs_all has jobs' columns"
    );
}
