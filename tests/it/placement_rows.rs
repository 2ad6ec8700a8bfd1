//! The placement writes its jobs in its own statement (`place_order.sql`),
//! past the enqueue: these tests hold its rows to what the `Enqueuer` writes
//! for the same jobs (`placement_jobs`, enqueued beside them), column by
//! column, with their concurrency keys and their NOTIFYs, and check that a
//! failure anywhere in the statement writes nothing.

use std::collections::BTreeSet;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Jsonb, Text};
use order_service::endpoints::nats::{NatsTarget, StreamName, SubjectPrefix};
use order_service::endpoints::spec::{EndpointName, EndpointUrl, EventTypes, SigningSecret};
use order_service::endpoints::{NewEndpoint, store};
use order_service::orders::{
    EventJobs, EventSubscribers, OrderId, order_enqueuer, place_order, placement_jobs,
};
use order_service::schema::{endpoints, jobs_all};
use serde_json::Value;

use crate::support::{TestDb, sample_order};

fn add(conn: &mut PgConnection, name: &str, nats: bool) -> i64 {
    let (url, nats) = if nats {
        let target = NatsTarget {
            stream: StreamName::parse("ORDERS").expect("stream"),
            subject_prefix: SubjectPrefix::parse("orders").expect("prefix"),
        };
        ("nats://127.0.0.1:4222", Some(target))
    } else {
        ("http://127.0.0.1:9/hooks", None)
    };
    store::add(
        conn,
        &NewEndpoint {
            name: EndpointName::parse(name).expect("name"),
            url: EndpointUrl::parse(url, true).expect("url"),
            event_types: EventTypes::ALL,
            rate_limit: None,
            max_in_flight: 4,
            secret: SigningSecret::generate().expect("secret"),
            nats,
        },
        &order_service::sealed::Keyring::none(),
    )
    .expect("endpoint")
    .id
}

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = Jsonb)]
    row: Value,
}

/// The rows of `ids`, in id order, as JSON; `id` and `created_at` left out,
/// `run_after` checked to be `created_at` (due at once) and left out, and
/// each parent id written as its distance from the batch's first id.
fn rows(conn: &mut PgConnection, ids: &[i64]) -> Vec<Value> {
    let first = ids[0];
    diesel::sql_query("SELECT to_jsonb(j) AS row FROM jobs AS j WHERE id = ANY($1) ORDER BY id")
        .bind::<Array<BigInt>, _>(ids)
        .load::<Row>(conn)
        .expect("rows")
        .into_iter()
        .map(|Row { mut row }| {
            let fields = row.as_object_mut().expect("an object");
            assert_eq!(fields["run_after"], fields["created_at"], "due at once");
            for column in ["id", "created_at", "run_after"] {
                fields.remove(column);
            }
            for column in ["waiting_on", "depends_on"] {
                if let Some(Value::Array(parents)) = fields.get_mut(column) {
                    for parent in parents {
                        *parent = (parent.as_i64().expect("an id") - first).into();
                    }
                }
            }
            row
        })
        .collect()
}

fn subscribers(conn: &mut PgConnection) -> EventSubscribers {
    diesel::sql_query("SELECT * FROM order_event_subscribers('order.placed')")
        .get_result(conn)
        .expect("subscribers")
}

fn concurrency_keys(conn: &mut PgConnection) -> BTreeSet<String> {
    #[derive(QueryableByName)]
    struct Key {
        #[diesel(sql_type = Text)]
        key: String,
    }
    diesel::sql_query("SELECT key FROM job_concurrency_keys")
        .load::<Key>(conn)
        .expect("keys")
        .into_iter()
        .map(|k| k.key)
        .collect()
}

/// The kinds notified on `conn` since the last call.
fn notified(conn: &mut PgConnection) -> BTreeSet<String> {
    // Notifications arrive with a statement's answer: run one.
    diesel::sql_query("SELECT 1").execute(conn).expect("poll");
    conn.notifications_iter()
        .map(|n| n.expect("a notification").payload)
        .collect()
}

/// Places an order with `jobs` on a connection that LISTENs, then enqueues
/// `placement_jobs` for the same order and event through the enqueuer, and
/// compares: the rows, the concurrency keys' rows the placement made, and
/// the kinds each notified.
fn placement_writes_the_enqueuers_rows(conn: &mut PgConnection, jobs: EventJobs) -> Vec<Value> {
    diesel::sql_query("DELETE FROM job_concurrency_keys")
        .execute(conn)
        .expect("no keys yet");
    diesel::sql_query("LISTEN outbox_jobs")
        .execute(conn)
        .expect("listen");
    let placed = place_order(conn, &order_enqueuer(), &sample_order(), None, jobs).expect("placed");
    let woken_by_placement = notified(conn);
    let created = placed.created.expect("a new order");
    let order_id = OrderId::new(placed.placement.order_id());
    let placed_ids: Vec<i64> = created.jobs.iter().map(|j| j.id).collect();
    let stored_ids: Vec<i64> = jobs_all::table
        .filter(jobs_all::order_id.eq(order_id.get()))
        .order(jobs_all::id)
        .select(jobs_all::id)
        .load(conn)
        .expect("ids");
    assert_eq!(placed_ids, stored_ids, "the answer names the jobs written");
    let keys_by_placement = concurrency_keys(conn);

    let event_id = created.events[0].id;
    let reference = placement_jobs(order_id, event_id, &subscribers(conn), jobs).expect("jobs");
    diesel::sql_query("DELETE FROM job_concurrency_keys")
        .execute(conn)
        .expect("keys again from nothing");
    let enqueued_ids = conn
        .transaction(|conn| order_enqueuer().enqueue_many(conn, &reference))
        .expect("enqueued");
    let woken_by_enqueue = notified(conn);

    let written = rows(conn, &placed_ids);
    assert_eq!(written, rows(conn, &enqueued_ids));
    assert_eq!(keys_by_placement, concurrency_keys(conn));
    assert_eq!(woken_by_placement, woken_by_enqueue);
    let kinds: BTreeSet<String> = created.jobs.iter().map(|j| j.kind.clone()).collect();
    assert_eq!(woken_by_placement, kinds);
    written
}

#[test]
fn a_placement_without_endpoints_writes_the_enqueuers_rows_and_an_unaddressed_delivery() {
    let db = TestDb::new();
    let mut conn = db.conn();

    let written = placement_writes_the_enqueuers_rows(&mut conn, 5.into());

    assert_eq!(written.len(), 3);
    assert_eq!(written[0]["depends_on"], serde_json::json!([1]));
    assert_eq!(written[0]["dependency_policy"], "run");
    assert_eq!(written[2]["kind"], "order_webhook");
    assert_eq!(written[2]["concurrency_key"], Value::Null);
}

#[test]
fn a_placement_to_webhook_and_nats_endpoints_writes_the_enqueuers_rows_and_keys() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let hook = add(&mut conn, "erp", false);
    let stream = add(&mut conn, "stream", true);
    add(&mut conn, "crm", false);

    let written = placement_writes_the_enqueuers_rows(&mut conn, 8.into());

    let kinds: Vec<&str> = written
        .iter()
        .map(|r| r["kind"].as_str().expect("kind"))
        .collect();
    assert_eq!(
        kinds,
        [
            "confirmation_email",
            "receipt_pdf",
            "order_webhook",
            "order_webhook",
            "order_publish"
        ]
    );
    assert_eq!(written[2]["concurrency_key"], format!("endpoint:{hook}"));
    assert_eq!(written[4]["concurrency_key"], format!("endpoint:{stream}"));
    assert_eq!(concurrency_keys(&mut conn).len(), 3);
}

#[test]
fn a_placement_past_fanout_inline_writes_one_fanout_as_the_enqueuer_does() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let ids: Vec<i64> = (0..5)
        .map(|n| add(&mut conn, &format!("e{n}"), n == 4))
        .collect();
    // A gap in the ids: the fan-out names them as two runs.
    diesel::update(endpoints::table.find(ids[2]))
        .set(endpoints::enabled.eq(false))
        .execute(&mut conn)
        .expect("disable one");
    let jobs = EventJobs {
        // Below 1: the jobs get one attempt, the fan-out keeps the setting.
        max_attempts: 0,
        fanout_inline: 2,
    };

    let written = placement_writes_the_enqueuers_rows(&mut conn, jobs);

    assert_eq!(written.len(), 3);
    assert_eq!(written[2]["kind"], "order_fanout");
    assert_eq!(written[2]["max_attempts"], 1);
    assert_eq!(
        written[2]["payload"]["webhook_endpoints"],
        serde_json::json!([[ids[0], ids[1]], [ids[3], ids[3]]])
    );
    assert_eq!(
        written[2]["payload"]["nats_endpoints"],
        serde_json::json!([[ids[4], ids[4]]])
    );
}

#[test]
fn a_placement_that_fails_at_its_jobs_writes_nothing_and_wakes_no_one() {
    let db = TestDb::new();
    let mut conn = db.conn();
    add(&mut conn, "erp", false);
    diesel::sql_query("DELETE FROM job_concurrency_keys")
        .execute(&mut conn)
        .expect("no keys yet");
    // The jobs are the last rows the statement writes: refuse them.
    diesel::sql_query(
        "CREATE FUNCTION refuse_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN RAISE EXCEPTION 'refusing the jobs on purpose'; END $$",
    )
    .execute(&mut conn)
    .expect("trigger function");
    diesel::sql_query(
        "CREATE TRIGGER refuse_jobs BEFORE INSERT ON jobs
         FOR EACH ROW EXECUTE FUNCTION refuse_jobs()",
    )
    .execute(&mut conn)
    .expect("trigger");
    diesel::sql_query("LISTEN outbox_jobs")
        .execute(&mut conn)
        .expect("listen");

    let error = place_order(&mut conn, &order_enqueuer(), &sample_order(), None, 8)
        .expect_err("the placement fails");

    assert!(error.to_string().contains("refusing the jobs"), "{error}");
    let count = |conn: &mut PgConnection, table: &str| -> i64 {
        #[derive(QueryableByName)]
        struct N {
            #[diesel(sql_type = BigInt)]
            n: i64,
        }
        diesel::sql_query(format!("SELECT count(*) AS n FROM {table}"))
            .get_result::<N>(conn)
            .expect("count")
            .n
    };
    for table in [
        "orders",
        "order_items",
        "order_events",
        "jobs_all",
        "job_concurrency_keys",
    ] {
        assert_eq!(count(&mut conn, table), 0, "{table}");
    }
    assert_eq!(notified(&mut conn), BTreeSet::new());
}

#[test]
fn an_enqueuer_that_wakes_after_commit_sends_no_notify_from_the_placement_but_its_waker_does() {
    let db = TestDb::new();
    let mut conn = db.conn();
    diesel::sql_query("LISTEN outbox_jobs")
        .execute(&mut conn)
        .expect("listen");
    let waker = order_service::outbox::Waker::new();
    let enqueuer = order_enqueuer().wake_after_commit(waker.clone());

    let placed = place_order(&mut conn, &enqueuer, &sample_order(), None, 8).expect("placed");

    // The waker is not running yet: any NOTIFY now is the statement's own.
    assert_eq!(notified(&mut conn), BTreeSet::new());
    let kinds: BTreeSet<String> = placed
        .created
        .expect("a new order")
        .jobs
        .into_iter()
        .map(|j| j.kind)
        .collect();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let stop = tokio_util::sync::CancellationToken::new();
    let sending = runtime.spawn(waker.run(db.pool(1), stop.clone()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut heard = BTreeSet::new();
    while heard != kinds && std::time::Instant::now() < deadline {
        heard.extend(notified(&mut conn));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    stop.cancel();
    runtime.block_on(sending).expect("the waker stops");
    assert_eq!(heard, kinds, "the waker was told the placement's kinds");
}
