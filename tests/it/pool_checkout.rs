//! The API's pool pings a connection on checkout only when it has sat in the
//! pool a while: one handed back a moment ago had just answered.

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{Integer, Text};

use crate::support::TestDb;

#[derive(QueryableByName)]
struct Pid {
    #[diesel(sql_type = Integer)]
    pid: i32,
}

#[derive(QueryableByName)]
struct Query {
    #[diesel(sql_type = Text)]
    query: String,
}

/// The last statement the server ran on backend `pid`.
fn last_statement(observer: &mut PgConnection, pid: i32) -> String {
    diesel::sql_query("SELECT query FROM pg_stat_activity WHERE pid = $1")
        .bind::<Integer, _>(pid)
        .get_result::<Query>(observer)
        .expect("the pooled backend")
        .query
}

#[test]
fn a_connection_handed_back_a_moment_ago_is_not_pinged_and_one_idle_for_a_second_is() {
    let db = TestDb::new();
    let mut observer = db.conn();
    let pool = order_service::db::build_pool(
        &db.url,
        &order_service::db::PoolOptions {
            size: 1,
            validate_on_checkout: true,
            ..order_service::db::PoolOptions::default()
        },
    );
    let pid = {
        let mut conn = pool.get().expect("a connection");
        diesel::sql_query("SELECT pg_backend_pid() AS pid")
            .get_result::<Pid>(&mut **conn)
            .expect("pid")
            .pid
    };

    drop(pool.get().expect("the same connection, at once"));
    let at_once = last_statement(&mut observer, pid);
    std::thread::sleep(Duration::from_millis(1_100));
    drop(pool.get().expect("the same connection, a second later"));
    let later = last_statement(&mut observer, pid);

    assert!(at_once.contains("pg_backend_pid"), "{at_once}");
    assert_eq!(later, "SELECT 1");
}
