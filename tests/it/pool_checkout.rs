//! The API's pool pings a connection on checkout only when it has sat in the
//! pool a while: one handed back a moment ago had just answered.

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{Integer, Text};

use crate::support::TestDb;
use crate::support::db::terminate_backends;

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

#[derive(Debug, QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

#[tokio::test]
async fn one_lost_connection_has_the_others_handed_back_before_it_pinged() {
    let db = TestDb::new();
    let mut observer = db.conn();
    let pool = order_service::db::build_pool(
        &db.url,
        &order_service::db::PoolOptions {
            size: 3,
            validate_on_checkout: true,
            ..order_service::db::PoolOptions::default()
        },
    );
    // Three connections in the pool, all handed back a moment ago.
    let held: Vec<_> = (0..3).map(|_| pool.get().expect("a connection")).collect();
    drop(held);
    let ended = terminate_backends(&mut observer, &db.name, 0, Duration::from_secs(5));
    assert_eq!(ended, 3, "the pool's three sessions ended");

    let select = || {
        order_service::db::run_blocking(&pool, |conn| {
            Ok(diesel::sql_query("SELECT 1::bigint AS n").get_result::<Count>(conn)?)
        })
    };
    // The first request meets a dead connection without a ping: it fails as
    // a connection lost mid-request does.
    let first = select().await.expect_err("a dead connection");
    assert!(first.is_unavailable(), "{first}");
    // That loss has the two others pinged and replaced: no request after it
    // fails.
    for _ in 0..3 {
        assert_eq!(select().await.expect("a live connection").n, 1);
    }
}
