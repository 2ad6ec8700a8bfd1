//! Placing orders: one transaction for the order, its items and its jobs.

use crate::support::enqueue;
use diesel::prelude::*;
use outbox_relay::orders::order_enqueuer;
use outbox_relay::orders::{
    IdempotencyKey, OrderId, OrderStatus, PlaceOrderError, Placement, load_order, load_order_jobs,
    place_order,
};
use outbox_relay::outbox::NewJob;
use outbox_relay::schema::{jobs_all, order_items, orders};

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

    let result = outbox_relay::orders::place_order(
        &mut conn,
        &order_enqueuer(),
        &sample_order(),
        None,
        outbox_relay::outbox::DEFAULT_MAX_ATTEMPTS,
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
    let other = outbox_relay::orders::NewOrder::parse(&order_json("Someone Else")).expect("valid");
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
