//! Placing orders: one transaction for the order, its items and its jobs.

use crate::support::enqueue;
use diesel::prelude::*;
use order_service::orders::order_enqueuer;
use order_service::orders::{
    IdempotencyKey, OrderId, OrderStatus, PlaceOrderError, Placement, load_order, load_order_jobs,
    place_order,
};
use order_service::outbox::NewJob;
use order_service::schema::{jobs_all, order_items, orders};

use crate::support::{TestDb, order_json, sample_order};

#[test]
fn placing_an_order_writes_the_order_its_items_and_three_jobs_together() {
    let db = TestDb::new();
    let mut conn = db.conn();

    let placed = place_order(&mut conn, &order_enqueuer(), &sample_order(), None, 5)
        .expect("placed")
        .placement;

    let Placement::Created(order_id) = placed else {
        panic!("expected a new order, got {placed:?}")
    };
    let order = load_order(&mut conn, OrderId::new(order_id))
        .expect("query")
        .expect("order exists");
    assert_eq!(order.id, OrderId::new(order_id));
    assert_eq!(order.status, OrderStatus::Placed);
    assert_eq!(order.currency.code(), "EUR");
    assert_eq!(order.total_cents, 2 * 450 + 1200);
    assert_eq!(order.items.len(), 2);
    let jobs = load_order_jobs(&mut conn, OrderId::new(order_id)).expect("jobs");
    let mut kinds: Vec<_> = jobs.iter().map(|j| j.kind.as_str()).collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        ["confirmation_email", "order_webhook", "receipt_pdf"]
    );
    assert!(
        jobs.iter()
            .all(|j| j.status == "pending" && j.attempts == 0 && j.max_attempts == 5)
    );
}

#[test]
fn a_failure_after_the_order_insert_leaves_nothing_behind() {
    let db = TestDb::new();
    let mut conn = db.conn();

    // The items are written after the order row: make that write fail, in
    // this test's own database, so the placement fails half-way.
    diesel::sql_query(
        "CREATE FUNCTION refuse_items() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF (SELECT count(*) FROM orders) <> 1 THEN
                 RAISE EXCEPTION 'the order row should be there inside the transaction';
             END IF;
             RAISE EXCEPTION 'failing half-way on purpose';
         END $$",
    )
    .execute(&mut conn)
    .expect("trigger function");
    diesel::sql_query(
        "CREATE TRIGGER refuse_items BEFORE INSERT ON order_items
         FOR EACH ROW EXECUTE FUNCTION refuse_items()",
    )
    .execute(&mut conn)
    .expect("trigger");

    let result = order_service::orders::place_order(
        &mut conn,
        &order_enqueuer(),
        &sample_order(),
        None,
        order_service::outbox::DEFAULT_MAX_ATTEMPTS,
    );

    let error = result.expect_err("the placement fails");
    assert!(
        error.to_string().contains("failing half-way on purpose"),
        "{error}"
    );
    assert_eq!(
        orders::table
            .count()
            .get_result::<i64>(&mut conn)
            .expect("count"),
        0
    );
    assert_eq!(
        order_items::table
            .count()
            .get_result::<i64>(&mut conn)
            .expect("count"),
        0
    );
    assert_eq!(
        jobs_all::table
            .count()
            .get_result::<i64>(&mut conn)
            .expect("count"),
        0
    );
}

#[test]
fn an_enqueue_inside_a_callers_transaction_that_rolls_back_leaves_no_job() {
    let db = TestDb::new();
    let mut conn = db.conn();

    let result: Result<(), diesel::result::Error> = conn.transaction(|conn| {
        enqueue(conn, &NewJob::new("noop", serde_json::json!({})))?;
        Err(diesel::result::Error::RollbackTransaction)
    });
    assert!(result.is_err());
    assert_eq!(
        jobs_all::table
            .count()
            .get_result::<i64>(&mut conn)
            .expect("count"),
        0
    );

    conn.transaction(|conn| enqueue(conn, &NewJob::new("noop", serde_json::json!({}))))
        .expect("committed enqueue");
    assert_eq!(
        jobs_all::table
            .count()
            .get_result::<i64>(&mut conn)
            .expect("count"),
        1
    );
}

#[test]
fn the_same_idempotency_key_returns_the_same_order_and_a_different_body_conflicts() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let key = IdempotencyKey::parse("order-abc-1").expect("valid key");

    let first = place_order(&mut conn, &order_enqueuer(), &sample_order(), Some(&key), 8)
        .expect("first")
        .placement;
    let again = place_order(&mut conn, &order_enqueuer(), &sample_order(), Some(&key), 8)
        .expect("again")
        .placement;
    let other = order_service::orders::NewOrder::parse(&order_json("Someone Else")).expect("valid");
    let conflict = place_order(&mut conn, &order_enqueuer(), &other, Some(&key), 8);

    let Placement::Created(id) = first else {
        panic!("{first:?}")
    };
    assert_eq!(again, Placement::Existing(id));
    assert!(
        matches!(conflict, Err(PlaceOrderError::IdempotencyConflict { existing_order_id }) if existing_order_id == id)
    );
    assert_eq!(
        orders::table
            .count()
            .get_result::<i64>(&mut conn)
            .expect("count"),
        1
    );
    assert_eq!(
        jobs_all::table
            .count()
            .get_result::<i64>(&mut conn)
            .expect("count"),
        3
    );
}

/// A relay finishing an order's delivery and storing its receipt in one
/// transaction, while the order moves on: the transition holds the order's row
/// and waits for the delivery it must queue behind, and the receipt's foreign
/// key check waits for the order's row. With `FOR UPDATE` on the order that
/// is a deadlock (a cancel fails with "deadlock detected"); the
/// transition's `FOR NO KEY UPDATE` leaves the key check free.
#[test]
fn a_transition_waiting_on_a_delivery_does_not_deadlock_with_the_receipt_of_its_order() {
    use order_service::endpoints::spec::{EndpointName, EndpointUrl, EventTypes, SigningSecret};
    use order_service::endpoints::{NewEndpoint, store};
    use order_service::orders::{Transition, transition_order};

    let db = TestDb::new();
    let mut conn = db.conn();
    store::add(
        &mut conn,
        &NewEndpoint {
            name: EndpointName::parse("erp").expect("name"),
            url: EndpointUrl::parse("http://127.0.0.1:9/hooks", true).expect("url"),
            event_types: EventTypes::ALL,
            rate_limit: None,
            max_in_flight: 4,
            secret: SigningSecret::generate().expect("secret"),
            nats: None,
        },
        &order_service::sealed::Keyring::none(),
    )
    .expect("endpoint");
    let order_id = place_order(&mut conn, &order_enqueuer(), &sample_order(), None, 8)
        .expect("placed")
        .order_id();
    let head: i64 = jobs_all::table
        .filter(jobs_all::kind.eq("order_webhook"))
        .select(jobs_all::id)
        .first(&mut conn)
        .expect("the order.placed delivery");

    // The relay's side: the delivery is being finished (its row is locked)...
    let mut relay = db.conn();
    diesel::sql_query("BEGIN")
        .execute(&mut relay)
        .expect("begin");
    diesel::sql_query("SET LOCAL lock_timeout = '10s'")
        .execute(&mut relay)
        .expect("lock_timeout");
    diesel::sql_query("UPDATE jobs SET last_error = NULL WHERE id = $1")
        .bind::<diesel::sql_types::BigInt, _>(head)
        .execute(&mut relay)
        .expect("lock the delivery");

    // ...when the order is paid: its transaction queues the order.paid
    // delivery behind the locked one, and waits there.
    let url = db.url.clone();
    let paying = std::thread::spawn(move || {
        let mut conn = PgConnection::establish(&url).expect("connect");
        diesel::sql_query("SET lock_timeout = '10s'")
            .execute(&mut conn)
            .expect("lock_timeout");
        let pay = Transition::parse("pay", &serde_json::json!({"payment_reference": "pi_1"}))
            .expect("pay");
        transition_order(&mut conn, &order_enqueuer(), order_id, &pay, None, 8)
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        #[derive(QueryableByName)]
        struct Waiting {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let waiting: Waiting = diesel::sql_query(
            "SELECT count(*) AS n FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .get_result(&mut conn)
        .expect("pg_stat_activity");
        if waiting.n > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the transition never waited on the delivery"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }

    // The relay stores the order's receipt in the same transaction and commits.
    diesel::sql_query(
        "INSERT INTO receipts (order_id, pdf) SELECT $1, '\\x25504446'::bytea
         WHERE EXISTS (SELECT 1 FROM orders WHERE id = $1)",
    )
    .bind::<diesel::sql_types::BigInt, _>(order_id)
    .execute(&mut relay)
    .expect("the receipt is stored while the transition waits");
    diesel::sql_query("COMMIT")
        .execute(&mut relay)
        .expect("commit");

    let paid = paying.join().expect("the paying thread");
    assert!(paid.is_ok(), "the transition failed: {paid:?}");
    let status: String = orders::table
        .find(order_id)
        .select(orders::status)
        .first(&mut conn)
        .expect("order");
    assert_eq!(status, "paid");
}

#[test]
fn a_connection_prepares_the_placement_with_its_jobs_once_and_reuses_it() {
    #[derive(QueryableByName)]
    struct Prepared {
        #[diesel(sql_type = diesel::sql_types::Text)]
        statement: String,
    }
    let db = TestDb::new();
    let mut conn = db.conn();
    for _ in 0..3 {
        place_order(&mut conn, &order_enqueuer(), &sample_order(), None, 5).expect("placed");
    }
    let statements: Vec<String> = diesel::sql_query("SELECT statement FROM pg_prepared_statements")
        .load::<Prepared>(&mut conn)
        .expect("this session's prepared statements")
        .into_iter()
        .map(|p| p.statement)
        .collect();
    let count = |marker: &str| statements.iter().filter(|s| s.contains(marker)).count();
    // Prepared on the first call, kept for the next two (a statement run
    // unprepared is not in the view at all); the order and its jobs are
    // written by the placement's one statement (its call of the function
    // place_order), with no insert of their own.
    assert_eq!(count("FROM place_order("), 1, "{statements:#?}");
    assert_eq!(count("INSERT INTO orders"), 0, "{statements:#?}");
    assert_eq!(count("INSERT INTO \"orders\""), 0, "{statements:#?}");
    assert_eq!(count("INSERT INTO \"jobs\""), 0, "{statements:#?}");
    #[derive(QueryableByName)]
    struct Jobs {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let jobs: Jobs = diesel::sql_query("SELECT count(*) AS n FROM jobs")
        .get_result(&mut conn)
        .expect("jobs");
    // The confirmation, the receipt and the webhook of each order.
    assert_eq!(jobs.n, 9);
}
