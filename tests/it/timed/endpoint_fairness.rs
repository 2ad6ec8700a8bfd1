//! A slow endpoint costs a fast one little: two fairness runs at once, one
//! with a slow endpoint beside the fast one, timed on a quiet machine.

use std::time::Duration;

use diesel::prelude::*;

use crate::endpoint_delivery::{add_endpoint, delivery_relay, place};
use crate::support::http::{Answer, HttpSink};
use crate::support::{RunningRelay, TestDb, init_tracing, wait_until};
use order_service::schema::jobs_all;

/// Places `n` orders at `per_second`, on a blocking thread.
async fn place_paced(db: &TestDb, n: usize, per_second: f64) {
    let url = db.url.clone();
    tokio::task::spawn_blocking(move || {
        let mut conn = PgConnection::establish(&url).expect("connect");
        let start = std::time::Instant::now();
        for i in 0..n {
            let due = start + Duration::from_secs_f64(i as f64 / per_second);
            std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
            place(&mut conn);
        }
    })
    .await
    .expect("placing orders");
}

/// Delivery latency of each request `sink` received: arrival minus the
/// placement of its order (the job's created_at).
fn latencies_ms(conn: &mut PgConnection, sink: &HttpSink) -> Vec<f64> {
    let created: std::collections::HashMap<i64, chrono::DateTime<chrono::Utc>> = jobs_all::table
        .filter(jobs_all::kind.eq("order_webhook"))
        .select((jobs_all::id, jobs_all::created_at))
        .load::<(i64, chrono::DateTime<chrono::Utc>)>(conn)
        .expect("jobs")
        .into_iter()
        .collect();
    let mut out: Vec<f64> = sink
        .requests()
        .iter()
        .map(|r| {
            let id: i64 = r
                .header("webhook-id")
                .and_then(|h| h.strip_prefix("order-webhook-"))
                .and_then(|id| id.parse().ok())
                .expect("webhook-id");
            (r.at - created[&id]).num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0
        })
        .collect();
    out.sort_by(f64::total_cmp);
    out
}

fn p99(sorted: &[f64]) -> f64 {
    sorted[((sorted.len() as f64 * 0.99).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// The mean of the slowest 5% (at least one): the tail, read from 25 of 500
/// samples rather than from the 5th slowest alone, as p99 is.
fn tail_mean(sorted: &[f64]) -> f64 {
    let k = (sorted.len() / 20).max(1);
    sorted[sorted.len() - k..].iter().sum::<f64>() / k as f64
}

const ORDERS: usize = 500;
/// Orders a second: a 5 s window, timed with the machine to itself. At 100
/// a second the tail's ratio alone read 0.88x to 1.07x in four runs, as it
/// did at 50 (0.88x to 1.09x, below); with the slow endpoint's max_in_flight
/// above the relay's 16 slots, the fast one still never got its 500 orders.
const PACE: f64 = 100.0;
/// The slow receiver's answer time: far longer than a fast delivery, so that
/// its four calls hold their slots throughout the fast endpoint's run (its
/// backlog grows at [`PACE`]), and short enough that the run sees several
/// rounds of them and the relay's stop, which lets the last round answer,
/// comes soon after the run.
const SLOW: Duration = Duration::from_secs(3);

/// What a fairness run leaves running: its relay, which a stop lets finish
/// the slow receiver's calls (up to [`SLOW`]), and what the relay uses.
struct FairnessRig {
    relay: RunningRelay,
    _receivers: (HttpSink, HttpSink),
    _db: TestDb,
}

impl FairnessRig {
    async fn stop(self) {
        self.relay.stop().await;
    }
}

/// The fast endpoint's delivery latencies for [`ORDERS`] orders, with a slow
/// endpoint beside it or not; with it, also the slow receiver's arrivals.
/// The relay is still running: it is stopped once the machine is no longer
/// kept quiet for the measurement.
async fn fairness_run(
    with_slow: bool,
) -> (Vec<f64>, Vec<chrono::DateTime<chrono::Utc>>, FairnessRig) {
    let db = TestDb::new();
    let mut conn = db.conn();
    let fast = HttpSink::start([], Answer::status(204)).await;
    let slow = HttpSink::start([], Answer::Hang(SLOW)).await;
    add_endpoint(&mut conn, "fast", &fast, None, 16);
    if with_slow {
        add_endpoint(&mut conn, "slow", &slow, None, 4);
    }
    let relay = delivery_relay(&db, &fast, 16);
    place_paced(&db, ORDERS, PACE).await;
    wait_until(
        "the fast endpoint has every order",
        Duration::from_secs(60),
        || fast.requests().len() == ORDERS,
    )
    .await;
    if with_slow {
        // Calls have ended and new ones begun: more arrivals than its
        // max_in_flight (at this pace, already so when the fast one is done).
        wait_until("a second round of slow calls", SLOW * 3, || {
            slow.requests().len() > 4
        })
        .await;
    }
    let latencies = latencies_ms(&mut conn, &fast);
    let arrivals = slow.requests().iter().map(|r| r.at).collect();
    let rig = FairnessRig {
        relay,
        _receivers: (fast, slow),
        _db: db,
    };
    (latencies, arrivals, rig)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_endpoint_costs_a_fast_one_little_and_never_exceeds_its_max_in_flight() {
    // Alone on the machine while it measures: its bound is about the code,
    // not its neighbours. Beside the light tests, in CI, the p99 ratio went
    // past 2x once; beside a second full suite here, the tail's ratio read
    // 0.77x to 1.87x in eight runs.
    let heavy = crate::support::seats::heavy();
    let quiet = crate::support::seats::quiet(&heavy);
    init_tracing();
    // Both runs at once, each on its own database with its own relay and
    // receivers: whatever else loads the machine (the rest of the suite, in
    // parallel) then loads both alike, and the ratio measures the slow
    // endpoint, not which of two minutes was busier. Run one after the
    // other, the p99 ratio was 1.3x to 2.2x in recorded runs, with the load.
    let ((alone, _, alone_rig), (shared, slow_arrivals, shared_rig)) =
        tokio::join!(fairness_run(false), fairness_run(true));
    // Measured: the slow receiver's last calls, which the stop waits for,
    // need no quiet machine.
    drop(quiet);
    tokio::join!(alone_rig.stop(), shared_rig.stop());
    let (alone_p99, shared_p99) = (p99(&alone), p99(&shared));
    let (alone_tail, shared_tail) = (tail_mean(&alone), tail_mean(&shared));
    eprintln!(
        "fast endpoint delivery latency, alone / beside a {}s endpoint: p99 {alone_p99:.1} / {shared_p99:.1} ms, \
         mean of the slowest 5% {alone_tail:.1} / {shared_tail:.1} ms; slow endpoint calls begun: {}",
        SLOW.as_secs(),
        slow_arrivals.len()
    );
    // Open calls at each arrival: the arrivals of the previous answer time.
    let most_open = slow_arrivals
        .iter()
        .map(|&at| {
            slow_arrivals
                .iter()
                .filter(|&&other| {
                    other <= at && at - other < chrono::Duration::from_std(SLOW).expect("span")
                })
                .count()
        })
        .max()
        .unwrap_or(0);
    assert!(
        most_open <= 4,
        "the slow endpoint had {most_open} calls open (max_in_flight 4)"
    );
    assert!(
        slow_arrivals.len() >= 5,
        "the slow endpoint was being called: {}",
        slow_arrivals.len()
    );
    // The tail, not p99: the 5th slowest of 500 is one scheduling hiccup on
    // two cores. Alone, its ratio read 0.80x to 1.61x in twelve runs of this
    // code; the mean of the slowest 25 read 0.88x to 1.09x in six of them.
    // What the bound is for, slots held by the slow endpoint's calls, shows
    // in both alike: with 15 of the relay's 16 slots the slow endpoint's,
    // the tail's ratio read 1.16x and 2.84x in two runs (p99 1.30x and
    // 2.95x); with max_in_flight ignored, the fast endpoint never got its
    // 500 orders.
    assert!(
        shared_tail <= 2.0 * alone_tail,
        "the fast endpoint's slowest 5% took {shared_tail:.1} ms on average beside the slow one, \
         {alone_tail:.1} ms alone (p99 {shared_p99:.1} and {alone_p99:.1} ms)"
    );
}
