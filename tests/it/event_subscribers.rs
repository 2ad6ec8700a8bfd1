//! `event_type_subscribers`, the row per event type a placement reads instead
//! of every endpoint: whatever changes the endpoints, and however two such
//! changes interleave, each row says what reading the endpoints would say.

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};

use crate::support::TestDb;

#[derive(QueryableByName)]
struct Stale {
    #[diesel(sql_type = Text)]
    event_type: String,
}

/// The rows that differ from what the endpoints say now: their endpoints, or
/// the count and the id runs an order's fan-out job names them by.
fn stale_rows(conn: &mut PgConnection) -> Vec<String> {
    diesel::sql_query(
        "SELECT c.event_type FROM event_type_subscribers AS c, \
                LATERAL order_event_subscribers_now(c.event_type) AS s \
         WHERE (c.webhook_endpoints, c.nats_endpoints, c.any_endpoint) \
               IS DISTINCT FROM (s.webhook_endpoints, s.nats_endpoints, s.any_endpoint) \
            OR (c.endpoint_count, c.webhook_runs, c.nats_runs) \
               IS DISTINCT FROM (cardinality(s.webhook_endpoints) + cardinality(s.nats_endpoints), \
                                 endpoint_id_runs(s.webhook_endpoints), \
                                 endpoint_id_runs(s.nats_endpoints)) \
         ORDER BY 1",
    )
    .load::<Stale>(conn)
    .expect("compare the rows")
    .into_iter()
    .map(|row| row.event_type)
    .collect()
}

#[derive(QueryableByName, Debug, PartialEq)]
struct Subscribed {
    #[diesel(sql_type = diesel::sql_types::Array<BigInt>)]
    webhook_endpoints: Vec<i64>,
}

fn placed_subscribers(conn: &mut PgConnection) -> Vec<i64> {
    diesel::sql_query("SELECT webhook_endpoints FROM order_event_subscribers('order.placed')")
        .get_result::<Subscribed>(conn)
        .expect("read the subscribers")
        .webhook_endpoints
}

fn paid_subscribers(conn: &mut PgConnection) -> Vec<i64> {
    diesel::sql_query("SELECT webhook_endpoints FROM order_event_subscribers('order.paid')")
        .get_result::<Subscribed>(conn)
        .expect("read the subscribers")
        .webhook_endpoints
}

fn add(conn: &mut PgConnection, name: &str, event_types: Option<&str>) -> i64 {
    #[derive(QueryableByName)]
    struct Id {
        #[diesel(sql_type = BigInt)]
        id: i64,
    }
    diesel::sql_query(
        "INSERT INTO endpoints (name, url, event_types, secret, allow_http) \
         VALUES ($1, 'http://127.0.0.1:9/' || $1, string_to_array($2, ','), 'whsec_c2VjcmV0', true) \
         RETURNING id",
    )
    .bind::<Text, _>(name)
    .bind::<diesel::sql_types::Nullable<Text>, _>(event_types)
    .get_result::<Id>(conn)
    .expect("add an endpoint")
    .id
}

#[test]
fn every_change_to_the_endpoints_leaves_each_event_types_row_as_the_endpoints_say() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let all = add(&mut conn, "all", None);
    let paid = add(&mut conn, "paid", Some("order.paid,order.refunded"));
    let placed = add(&mut conn, "placed", Some("order.placed"));
    diesel::sql_query(
        "INSERT INTO endpoints (name, url, secret, stream, subject_prefix) \
         VALUES ('bus', 'nats://127.0.0.1:4222', 'whsec_c2VjcmV0', 'ORDERS', 'orders')",
    )
    .execute(&mut conn)
    .expect("add a NATS endpoint");
    assert_eq!(stale_rows(&mut conn), Vec::<String>::new());
    assert_eq!(placed_subscribers(&mut conn), [all, placed]);
    #[derive(QueryableByName)]
    struct Fanout {
        #[diesel(sql_type = Text)]
        runs: String,
        #[diesel(sql_type = diesel::sql_types::Integer)]
        count: i32,
    }
    let fanout: Fanout = diesel::sql_query(
        "SELECT webhook_runs::text AS runs, endpoint_count AS count \
         FROM event_type_subscribers WHERE event_type = 'order.placed'",
    )
    .get_result(&mut conn)
    .expect("the row's runs");
    assert_eq!(
        (fanout.runs, fanout.count),
        (format!("[[{all}, {all}], [{placed}, {placed}]]"), 3),
        "the webhooks by runs of ids (`paid` between them is not subscribed), and the NATS endpoint counted"
    );
    assert_eq!(
        paid_subscribers(&mut conn),
        [all, paid],
        "an endpoint of several types is in each type's row"
    );

    let changes = [
        "UPDATE endpoints SET enabled = false, disabled_reason = 'operator' WHERE name = 'all'",
        "UPDATE endpoints SET event_types = ARRAY['order.placed'] WHERE name = 'paid'",
        "UPDATE endpoints SET url = 'nats://127.0.0.1:4222', stream = 'ORDERS', \
         subject_prefix = 'placed' WHERE name = 'placed'",
        "UPDATE endpoints SET enabled = false, disabled_reason = 'failing' WHERE name = 'bus'",
        "UPDATE endpoints SET enabled = true, disabled_reason = NULL WHERE name = 'all'",
        "DELETE FROM endpoints WHERE name = 'paid'",
        "TRUNCATE endpoints CASCADE",
    ];
    for change in changes {
        diesel::sql_query(change)
            .execute(&mut conn)
            .unwrap_or_else(|e| panic!("{change}: {e}"));
        assert_eq!(
            stale_rows(&mut conn),
            Vec::<String>::new(),
            "after {change}"
        );
    }
    assert_eq!(placed_subscribers(&mut conn), Vec::<i64>::new());
    let again = add(&mut conn, "again", None);
    assert_eq!(placed_subscribers(&mut conn), [again]);
}

#[test]
fn two_writers_that_overlap_leave_both_changes_in_the_rows() {
    let db = TestDb::new();
    let mut first = db.conn();
    let mut second = db.conn();
    first
        .batch_execute("BEGIN")
        .expect("begin the first writer");
    let a = add(&mut first, "a", None);
    // The second writer's statement waits for the first's commit before it
    // touches an endpoint, then reads the endpoints after it.
    let url = db.url.clone();
    let writer = std::thread::spawn(move || {
        let mut conn = PgConnection::establish(&url).expect("connect");
        conn.batch_execute("BEGIN")
            .expect("begin the second writer");
        let b = add(&mut conn, "b", None);
        conn.batch_execute("COMMIT")
            .expect("commit the second writer");
        b
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !writer.is_finished(),
        "the second writer waits for the first"
    );
    first
        .batch_execute("COMMIT")
        .expect("commit the first writer");
    let b = writer.join().expect("the second writer");
    assert_eq!(placed_subscribers(&mut second), [a, b]);
    assert_eq!(stale_rows(&mut second), Vec::<String>::new());
}

#[test]
fn the_attempt_logs_updates_of_an_endpoint_do_not_wait_for_an_endpoint_writer() {
    let db = TestDb::new();
    let mut writer = db.conn();
    let mut attempts = db.conn();
    let id = add(&mut attempts, "busy", None);
    writer.batch_execute("BEGIN").expect("begin");
    add(&mut writer, "new", None);
    attempts
        .batch_execute("SET lock_timeout = '2s'")
        .expect("lock timeout");
    diesel::sql_query("UPDATE endpoints SET failing_since = now() WHERE id = $1")
        .bind::<BigInt, _>(id)
        .execute(&mut attempts)
        .expect("a delivery's health update goes through while the writer is open");
    writer.batch_execute("COMMIT").expect("commit");
    assert_eq!(stale_rows(&mut attempts), Vec::<String>::new());
}

#[test]
fn an_endpoint_change_under_repeatable_read_is_refused_saying_why() {
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .expect("begin");
    let error = diesel::sql_query(
        "INSERT INTO endpoints (name, url, secret, allow_http) \
         VALUES ('rr', 'http://127.0.0.1:9/', 'whsec_c2VjcmV0', true)",
    )
    .execute(&mut conn)
    .expect_err("refused");
    assert!(error.to_string().contains("READ COMMITTED"), "{error}");
}
