//! Payments in under crashes: two `serve` replicas receive a provider's
//! events, copies of one event reach both at once, one replica is SIGKILLed
//! partway, and the provider's retries go to the survivor. Every order is
//! paid exactly once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use diesel::prelude::*;
use diesel::sql_types::BigInt;
use order_service::inbox::source::{self, SourceKind, SourceMode};
use order_service::inbox::verify::stripe_signature;
use reqwest::StatusCode;
use serde_json::json;
use tokio::sync::Mutex;

use crate::inbox::{STRIPE_SECRET, intent_succeeded};
use crate::support::TestDb;
use crate::support::app::http_client;
use crate::support::process::{BinProcess, Launch};

const EVENTS: usize = 1_000;
/// After this many answers, the first replica is killed.
const KILL_AFTER: usize = 400;

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

fn count(conn: &mut PgConnection, sql: &str) -> i64 {
    diesel::sql_query(sql)
        .get_result::<Count>(conn)
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .n
}

/// One POST of `body`, freshly signed, as the provider sends it.
async fn send(client: &reqwest::Client, base: &str, body: &[u8]) -> Result<StatusCode, String> {
    let now = chrono::Utc::now().timestamp();
    client
        .post(format!("{base}/inbound/stripe"))
        .header(
            "stripe-signature",
            stripe_signature(STRIPE_SECRET, now, body),
        )
        .body(body.to_vec())
        .send()
        .await
        .map(|r| r.status())
        // A refused connection (the replica already dead) is told apart from a
        // request cut off while the replica was working on it.
        .map_err(|e| {
            if e.is_connect() {
                format!("{REFUSED}{e}")
            } else {
                e.to_string()
            }
        })
}

/// The prefix of a send's error when no connection was made at all.
const REFUSED: &str = "connect: ";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_and_a_sigkill_pay_every_order_exactly_once() {
    // It loads the machine and bounds no time: beside one other such test.
    let _loud = crate::support::seats::loud();
    let db = TestDb::new();
    let mut conn = db.conn();
    diesel::sql_query(
        "WITH o AS (INSERT INTO orders (customer_email, customer_name, currency, total_cents) \
         SELECT 'c' || g || '@example.com', 'C', 'EUR', 2100 FROM generate_series(1, 1000) g \
         RETURNING id) \
         INSERT INTO order_events (order_id, seq, type) SELECT id, 1, 'order.placed' FROM o",
    )
    .execute(&mut conn)
    .expect("orders");
    diesel::sql_query(
        "INSERT INTO endpoints (name, url, secret, allow_http) \
         VALUES ('erp', 'http://127.0.0.1:9/hooks', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', true)",
    )
    .execute(&mut conn)
    .expect("endpoint");
    source::add(
        &mut conn,
        "stripe",
        SourceKind::Stripe,
        SourceMode::Any,
        STRIPE_SECRET,
        &order_service::sealed::Keyring::none(),
    )
    .expect("source");
    let ids: Vec<i64> = order_service::schema::orders::table
        .select(order_service::schema::orders::id)
        .order(order_service::schema::orders::id)
        .load(&mut conn)
        .expect("ids");
    assert_eq!(ids.len(), EVENTS);

    let (doomed, doomed_url) = BinProcess::start_api(Launch::serve("api-doomed", &db.url)).await;
    let (mut survivor, survivor_url) =
        BinProcess::start_api(Launch::serve("api-survivor", &db.url)).await;
    let doomed = Arc::new(Mutex::new(Some(doomed)));
    let client = http_client();
    let answered = Arc::new(AtomicUsize::new(0));
    let survivor_failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    // Requests sent to the doomed replica and not yet answered, read at the
    // kill: the crash must come while the replica holds requests, not between
    // them, or the test shows nothing about a crash mid-transaction.
    let doomed_in_flight = Arc::new(AtomicUsize::new(0));
    let in_flight_at_kill = Arc::new(AtomicUsize::new(usize::MAX));
    let doomed_cut = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));

    // 20% are sent twice: half of those to both replicas at once, half again
    // after everything else, as a provider's retry.
    let bodies: Vec<Vec<u8>> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            intent_succeeded(
                &format!("evt_{i}"),
                json!(id.to_string()),
                2_100,
                "eur",
                &format!("pi_{i}"),
            )
        })
        .collect();
    let bodies = Arc::new(bodies);
    let gate = Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = Vec::new();
    for i in 0..EVENTS {
        let (client, bodies, gate) = (client.clone(), Arc::clone(&bodies), Arc::clone(&gate));
        let (doomed_url, survivor_url) = (doomed_url.clone(), survivor_url.clone());
        let (answered, failures) = (Arc::clone(&answered), Arc::clone(&survivor_failures));
        let doomed = Arc::clone(&doomed);
        let (in_flight, at_kill, cut) = (
            Arc::clone(&doomed_in_flight),
            Arc::clone(&in_flight_at_kill),
            Arc::clone(&doomed_cut),
        );
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire().await.expect("gate");
            let body = &bodies[i];
            let to_doomed = || async {
                in_flight.fetch_add(1, Ordering::SeqCst);
                let status = send(&client, &doomed_url, body).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                if let Err(e) = &status
                    && !e.starts_with(REFUSED)
                {
                    cut.lock().expect("lock").push(format!("evt_{i}: {e}"));
                }
                status
            };
            // The provider's retry after a failed delivery: to the survivor,
            // which must answer 200.
            let to_survivor = || async {
                let status = send(&client, &survivor_url, body).await;
                if status != Ok(StatusCode::OK) {
                    failures
                        .lock()
                        .expect("lock")
                        .push(format!("evt_{i}: {status:?}"));
                }
            };
            let first = if i % 10 == 0 {
                let (a, b) = tokio::join!(to_doomed(), send(&client, &survivor_url, body));
                if b != Ok(StatusCode::OK) {
                    failures
                        .lock()
                        .expect("lock")
                        .push(format!("evt_{i} (copy): {b:?}"));
                }
                a
            } else if i % 2 == 0 {
                to_doomed().await
            } else {
                send(&client, &survivor_url, body).await
            };
            if first != Ok(StatusCode::OK) {
                to_survivor().await;
            }
            if answered.fetch_add(1, Ordering::SeqCst) + 1 == KILL_AFTER
                && let Some(process) = doomed.lock().await.as_ref()
            {
                at_kill.store(in_flight.load(Ordering::SeqCst), Ordering::SeqCst);
                process.sigkill();
            }
        }));
    }
    for task in tasks {
        task.await.expect("sender");
    }
    // The provider's later retries of 20% of the events, one each.
    for i in (5..EVENTS).step_by(10) {
        let status = send(&client, &survivor_url, &bodies[i]).await;
        assert_eq!(status, Ok(StatusCode::OK), "evt_{i} resent");
    }
    let failures = survivor_failures.lock().expect("lock").clone();
    assert!(
        failures.is_empty(),
        "the survivor answered non-200: {failures:?}"
    );
    assert!(
        doomed
            .lock()
            .await
            .as_mut()
            .is_some_and(|p| !p.is_running()),
        "the first replica was killed partway"
    );

    let at_kill = in_flight_at_kill.load(Ordering::SeqCst);
    let cut = doomed_cut.lock().expect("lock").clone();
    eprintln!(
        "inbox SIGKILL: {at_kill} requests in flight at the doomed replica when it was killed, \
         {} cut off: {:?}",
        cut.len(),
        cut.iter().take(3).collect::<Vec<_>>()
    );
    assert!(
        at_kill > 0 && at_kill != usize::MAX,
        "the kill came while the doomed replica held requests (in flight: {at_kill})"
    );
    assert!(
        !cut.is_empty(),
        "at least one request was cut off by the kill, not refused after it"
    );

    let mut conn = db.conn();
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM orders WHERE status = 'paid'"
        ),
        1_000
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM order_events WHERE type = 'order.paid'"
        ),
        1_000,
        "one order.paid event per order"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM jobs_all j JOIN order_events e \
             ON e.id = (j.payload->>'event_id')::bigint \
             WHERE j.kind = 'order_webhook' AND e.type = 'order.paid'"
        ),
        1_000,
        "one delivery of each order.paid to the one endpoint"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM inbox_messages WHERE status = 'applied'"
        ),
        1_000
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM inbox_messages"),
        1_000
    );
    survivor.terminate().await;
}
