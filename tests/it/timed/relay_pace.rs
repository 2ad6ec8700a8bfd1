//! Slow HTTP effects keep their pace beside fast ones at the relay's
//! defaults, timed on a quiet machine.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use order_service::effects::EffectError;
use order_service::outbox::NewJob;

use crate::support::http::{Answer, HttpSink};
use crate::support::{
    TestDb, count, enqueue_many, executor, init_tracing, spawn_relay, test_settings, wait_until,
};

/// At the default concurrency and batch size, a backlog of fast effects with
/// slow ones among them (an HTTP call answered after 50 ms, every fifth job):
/// the slow ones keep close to concurrency / 50 ms, and the fast ones drain
/// beside them. Claims that grow ahead of the slots on a deep queue must not
/// take the slots from either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_http_effects_keep_their_pace_and_fast_ones_drain_beside_them_at_the_defaults() {
    // Alone among the heavy tests: its bound is about the code, not its neighbours.
    let _heavy = crate::support::seats::heavy();
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    const ANSWER_AFTER: Duration = Duration::from_millis(50);
    const CALLS: usize = 1280;
    const NOOPS: usize = 4 * CALLS;
    let sink = HttpSink::start([], Answer::Hang(ANSWER_AFTER)).await;
    let jobs: Vec<NewJob> = (0..CALLS + NOOPS)
        .map(|i| {
            let kind = if i % 5 == 4 { "call" } else { "noop" };
            NewJob::new(kind, serde_json::json!({ "i": i }))
        })
        .collect();
    for chunk in jobs.chunks(1000) {
        enqueue_many(&mut conn, chunk).expect("enqueue");
    }

    #[derive(Default)]
    struct Seen {
        calls_open: AtomicUsize,
        most_open: AtomicUsize,
        calls_done: AtomicUsize,
        noops_done: AtomicUsize,
        /// Noops run when the last call returned.
        noops_at_last_call: AtomicUsize,
        first_call: Mutex<Option<Instant>>,
        last_call: Mutex<Option<Instant>>,
    }
    let seen = Arc::new(Seen::default());
    let settings = test_settings("mix", &["noop", "call"]);
    assert_eq!(
        (settings.concurrency, settings.batch_size),
        (
            order_service::worker_pool::DEFAULT_CONCURRENCY,
            order_service::worker_pool::DEFAULT_BATCH_SIZE
        ),
        "measured at the defaults"
    );
    let concurrency = settings.concurrency;
    let (client, url) = (crate::support::app::http_client(), sink.url());
    let counted = Arc::clone(&seen);
    // The calls' pace is timed with no other test beside this one.
    let quiet = crate::support::seats::quiet(&_heavy);
    let relay = spawn_relay(
        &db,
        settings,
        executor(move |job| {
            let (seen, client, url) = (Arc::clone(&counted), client.clone(), url.clone());
            async move {
                if job.kind != "call" {
                    seen.noops_done.fetch_add(1, Ordering::SeqCst);
                    return Ok(None);
                }
                let now = Instant::now();
                seen.first_call.lock().expect("lock").get_or_insert(now);
                let open = seen.calls_open.fetch_add(1, Ordering::SeqCst) + 1;
                seen.most_open.fetch_max(open, Ordering::SeqCst);
                let answer = client.post(url).body("{}").send().await;
                seen.calls_open.fetch_sub(1, Ordering::SeqCst);
                let answer = answer.map_err(|e| EffectError::retryable(e.to_string()))?;
                if !answer.status().is_success() {
                    return Err(EffectError::retryable(format!("{}", answer.status())));
                }
                if seen.calls_done.fetch_add(1, Ordering::SeqCst) + 1 == CALLS {
                    *seen.last_call.lock().expect("lock") = Some(Instant::now());
                    seen.noops_at_last_call
                        .store(seen.noops_done.load(Ordering::SeqCst), Ordering::SeqCst);
                }
                Ok(None)
            }
        }),
    );
    wait_until("every job done", Duration::from_secs(120), || {
        count(&mut conn, "done") == (CALLS + NOOPS) as i64
    })
    .await;
    relay.stop().await;
    drop(quiet);

    let first = seen.first_call.lock().expect("lock").expect("a call ran");
    let last = seen
        .last_call
        .lock()
        .expect("lock")
        .expect("every call ran");
    let per_second = CALLS as f64 / (last - first).as_secs_f64();
    let bound = concurrency as f64 / ANSWER_AFTER.as_secs_f64();
    let most_open = seen.most_open.load(Ordering::SeqCst);
    let noops_then = seen.noops_at_last_call.load(Ordering::SeqCst);
    eprintln!(
        "calls: {per_second:.0}/s against a bound of {bound:.0}/s, at most {most_open} open; \
         {noops_then} of {NOOPS} noops run when the last call returned"
    );
    assert_eq!(
        seen.calls_done.load(Ordering::SeqCst),
        CALLS,
        "each call once"
    );
    assert_eq!(
        seen.noops_done.load(Ordering::SeqCst),
        NOOPS,
        "each noop once"
    );
    assert!(
        most_open <= concurrency,
        "{most_open} calls open at once, over RELAY_CONCURRENCY {concurrency}"
    );
    assert!(
        most_open >= concurrency * 3 / 4,
        "the calls never filled the slots: at most {most_open} open of {concurrency}"
    );
    // 0.4x, not "near" the bound: a debug build on a shared 2-core machine
    // stays well under it even alone, each claim of the free slots waiting
    // milliseconds for the server.
    assert!(
        per_second >= 0.4 * bound,
        "calls ran at {per_second:.0}/s, under 0.4x concurrency / 50 ms ({bound:.0}/s)"
    );
    assert!(
        noops_then >= NOOPS * 9 / 10,
        "only {noops_then} of {NOOPS} noops ran while the calls did: the slow effects starved them"
    );
}
