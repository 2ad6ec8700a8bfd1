//! Periodic jobs: each (name, slot) enqueued once across relays and
//! restarts, missed slots collapsed into one run. The clock is driven by slot
//! arithmetic (`enqueue_due_slot` at chosen times) where the property is the
//! statement's, and by short intervals where it is the relay's.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use outbox_core::outbox::{
    Enqueuer, PeriodicJob, declare_periodic_jobs, enqueue_due_slot, periodic_schedules,
};
use outbox_core::schema::jobs_all;
use outbox_core::worker::{EffectResult, JobArgs, JobContext, Worker, Workers};
use serde::{Deserialize, Serialize};

use crate::support::{TestDb, settings, spawn_relay, wait_until};

#[derive(Debug, Serialize, Deserialize)]
struct Sweep {}

impl JobArgs for Sweep {
    const KIND: &'static str = "sweep";
}

/// Counts each job it performs, by job id.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<HashMap<i64, u32>>>);

impl Worker<Sweep> for Runs {
    async fn work(&self, _args: Sweep, ctx: JobContext) -> EffectResult {
        *self.0.lock().expect("runs").entry(ctx.id()).or_default() += 1;
        Ok(None)
    }
}

fn at(text: &str) -> DateTime<Utc> {
    text.parse().expect("a timestamp")
}

fn every_second() -> PeriodicJob {
    PeriodicJob::every("sweep", Duration::from_secs(1), &Sweep {}).expect("valid")
}

/// The `run_after` of every sweep job, by the number of jobs with it.
fn slots_enqueued(conn: &mut PgConnection) -> BTreeMap<DateTime<Utc>, usize> {
    let run_after: Vec<DateTime<Utc>> = jobs_all::table
        .filter(jobs_all::kind.eq(Sweep::KIND))
        .select(jobs_all::run_after)
        .load(conn)
        .expect("jobs");
    let mut slots = BTreeMap::new();
    for slot in run_after {
        *slots.entry(slot).or_default() += 1;
    }
    slots
}

#[test]
fn three_relays_over_200_slots_enqueue_each_slot_exactly_once() {
    let db = TestDb::new();
    let base = at("2026-12-05T10:00:00Z");
    let job = every_second();
    declare_periodic_jobs(&mut db.conn(), std::slice::from_ref(&job), base).expect("declare");

    // Three relays wake for every slot at once, each at its own moment
    // inside the slot, and race to enqueue it.
    let start = Arc::new(Barrier::new(3));
    let relays: Vec<_> = (0..3)
        .map(|relay| {
            let (url, job, start) = (db.url.clone(), job.clone(), Arc::clone(&start));
            std::thread::spawn(move || {
                let mut conn = PgConnection::establish(&url).expect("connect");
                let enqueuer = Enqueuer::new();
                let mut won = 0;
                for slot in 1..=200 {
                    start.wait();
                    let offset = fastrand::i64(0..1000) + relay;
                    let now = base
                        + chrono::Duration::seconds(slot)
                        + chrono::Duration::milliseconds(offset.min(999));
                    if enqueue_due_slot(&mut conn, &enqueuer, &job, now)
                        .expect("enqueue")
                        .is_some()
                    {
                        won += 1;
                    }
                }
                won
            })
        })
        .collect();
    let won: usize = relays.into_iter().map(|r| r.join().expect("relay")).sum();

    let mut conn = db.conn();
    let slots = slots_enqueued(&mut conn);
    assert_eq!(won, 200, "one relay won each slot");
    assert_eq!(slots.len(), 200);
    assert!(slots.values().all(|&n| n == 1), "a slot enqueued twice");
    let expected: Vec<DateTime<Utc>> = (1..=200)
        .map(|s| base + chrono::Duration::seconds(s))
        .collect();
    assert_eq!(slots.keys().copied().collect::<Vec<_>>(), expected);
    // The newest slots are kept for `jobs schedules`, the rest pruned.
    let kept: i64 = diesel::sql_query("SELECT count(*) AS n FROM periodic_slots")
        .get_result::<Count>(&mut conn)
        .expect("count")
        .n;
    assert_eq!(kept, 100);
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

#[test]
fn a_relay_killed_mid_enqueue_leaves_its_slot_to_the_next_once() {
    let db = TestDb::new();
    let base = at("2026-12-05T10:00:00Z");
    let job = every_second();
    declare_periodic_jobs(&mut db.conn(), std::slice::from_ref(&job), base).expect("declare");
    let now = base + chrono::Duration::milliseconds(1500);

    // The first relay claims the slot and dies before its commit; the second,
    // meanwhile, waits on the first's claim instead of skipping the slot.
    let (claimed_tx, claimed_rx) = std::sync::mpsc::channel();
    let (die_tx, die_rx) = std::sync::mpsc::channel::<()>();
    let doomed = {
        let (url, job) = (db.url.clone(), job.clone());
        std::thread::spawn(move || {
            let mut conn = PgConnection::establish(&url).expect("connect");
            let _ = conn.transaction(|conn| -> QueryResult<()> {
                let slot = enqueue_due_slot(conn, &Enqueuer::new(), &job, now)?;
                claimed_tx.send(slot).expect("send");
                die_rx.recv().expect("told to die");
                Err(diesel::result::Error::RollbackTransaction)
            });
        })
    };
    let slot = claimed_rx
        .recv()
        .expect("claimed")
        .expect("the first relay won");
    assert_eq!(slot.slot, base + chrono::Duration::seconds(1));
    let heir = {
        let (url, job) = (db.url.clone(), job.clone());
        std::thread::spawn(move || {
            let mut conn = PgConnection::establish(&url).expect("connect");
            enqueue_due_slot(&mut conn, &Enqueuer::new(), &job, now).expect("enqueue")
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    assert!(!heir.is_finished(), "the heir waits on the claim");
    die_tx.send(()).expect("die");
    doomed.join().expect("the doomed relay");
    let heir = heir
        .join()
        .expect("heir")
        .expect("the heir enqueues the slot");
    assert_eq!(heir.slot, slot.slot);

    let mut conn = db.conn();
    let later = enqueue_due_slot(&mut conn, &Enqueuer::new(), &job, now).expect("enqueue");
    assert_eq!(later, None, "and nobody after it");
    let slots = slots_enqueued(&mut conn);
    assert_eq!(slots.into_iter().collect::<Vec<_>>(), vec![(slot.slot, 1)]);
}

#[test]
fn after_an_outage_of_five_slots_a_periodic_job_runs_once_not_five_times() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let base = at("2026-12-05T10:00:00Z");
    let job = every_second();
    let enqueuer = Enqueuer::new();
    // Declared half-way into a slot: that slot is not run; the next is.
    declare_periodic_jobs(
        &mut conn,
        std::slice::from_ref(&job),
        base + chrono::Duration::milliseconds(500),
    )
    .expect("declare");
    let run = |conn: &mut PgConnection, millis: i64| {
        enqueue_due_slot(
            conn,
            &enqueuer,
            &job,
            base + chrono::Duration::milliseconds(millis),
        )
        .expect("enqueue")
        .map(|enqueued| enqueued.slot)
    };
    assert_eq!(run(&mut conn, 900), None, "no slot since the declaration");
    assert_eq!(
        run(&mut conn, 1_100),
        Some(base + chrono::Duration::seconds(1))
    );

    // Every relay down from 1.1 s to 6.5 s: slots 2 to 6 missed.
    assert_eq!(
        run(&mut conn, 6_500),
        Some(base + chrono::Duration::seconds(6))
    );
    assert_eq!(run(&mut conn, 6_900), None);
    // A relay whose clock lags never runs a slot older than one that ran.
    assert_eq!(run(&mut conn, 4_200), None);
    assert_eq!(
        run(&mut conn, 7_000),
        Some(base + chrono::Duration::seconds(7))
    );
    assert_eq!(slots_enqueued(&mut conn).len(), 3, "slots 1, 6 and 7");

    let schedules = periodic_schedules(&mut conn, base + chrono::Duration::milliseconds(7_400))
        .expect("schedules");
    assert_eq!(schedules.len(), 1);
    assert_eq!(schedules[0].name, "sweep");
    assert_eq!(schedules[0].schedule, "every 1s");
    assert_eq!(
        schedules[0].last_run,
        Some(base + chrono::Duration::seconds(7))
    );
    assert_eq!(
        schedules[0].next_run,
        Some(base + chrono::Duration::seconds(8))
    );
}

fn sweep_every(interval: Duration) -> PeriodicJob {
    PeriodicJob::every("sweep", interval, &Sweep {}).expect("valid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_pools_and_a_restart_enqueue_and_run_each_slot_once() {
    let db = TestDb::new();
    let runs = Runs::default();
    let pool = |i: usize| {
        let workers = Workers::new().register::<Sweep, _>(runs.clone());
        let mut settings = settings(&format!("relay-{i}"), &workers);
        settings.periodic_jobs = vec![sweep_every(Duration::from_millis(200))];
        spawn_relay(&db, settings, workers)
    };
    let mut relays: Vec<_> = (0..3).map(pool).collect();
    let mut conn = db.conn();
    wait_until("three slots", Duration::from_secs(10), || {
        slots_enqueued(&mut conn).len() >= 3
    })
    .await;
    let first = relays.remove(0);
    first.stop().await;
    relays.push(pool(0));
    let before = slots_enqueued(&mut conn).len();
    wait_until("three more slots", Duration::from_secs(10), || {
        slots_enqueued(&mut conn).len() >= before + 3
    })
    .await;
    for relay in relays {
        relay.stop().await;
    }

    let slots = slots_enqueued(&mut conn);
    assert!(
        slots.values().all(|&n| n == 1),
        "a slot enqueued twice: {slots:?}"
    );
    let done: i64 = jobs_all::table
        .filter(jobs_all::kind.eq(Sweep::KIND))
        .filter(jobs_all::status.eq("done"))
        .count()
        .get_result(&mut conn)
        .expect("count");
    let runs = runs.0.lock().expect("runs").clone();
    assert!(runs.values().all(|&n| n == 1), "a job ran twice: {runs:?}");
    assert_eq!(i64::try_from(runs.len()).expect("small"), done);
    for slot in slots.keys() {
        assert_eq!(slot.timestamp_subsec_millis() % 200, 0, "{slot} is a slot");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_missed_while_every_pool_was_down_run_once_when_one_comes_back() {
    let db = TestDb::new();
    let interval = Duration::from_millis(200);
    let relay = || {
        let workers = Workers::new().register::<Sweep, _>(Runs::default());
        let mut settings = settings("relay", &workers);
        settings.periodic_jobs = vec![sweep_every(interval)];
        spawn_relay(&db, settings, workers)
    };
    let mut conn = db.conn();
    let first = relay();
    wait_until("a slot", Duration::from_secs(10), || {
        !slots_enqueued(&mut conn).is_empty()
    })
    .await;
    first.stop().await;
    let last_before = *slots_enqueued(&mut conn).keys().last().expect("a slot");

    // Down for five slots and more.
    tokio::time::sleep(interval * 6).await;
    let back_at = Utc::now();
    let second = relay();
    wait_until("a slot after the restart", Duration::from_secs(10), || {
        slots_enqueued(&mut conn).keys().any(|slot| *slot > back_at)
    })
    .await;
    second.stop().await;

    // The relay back enqueues the latest slot at its start (which may come
    // after `back_at` on a loaded machine), and none of the five before it.
    let after: Vec<DateTime<Utc>> = slots_enqueued(&mut conn)
        .into_keys()
        .filter(|slot| *slot > last_before)
        .collect();
    let outage = chrono::Duration::from_std(interval * 6).expect("small");
    assert!(
        after[0] >= last_before + outage,
        "no slot missed but the latest runs: {after:?} after {last_before}"
    );
    let during = after.iter().filter(|slot| **slot <= back_at).count();
    assert!(during <= 1, "one run for the outage: {after:?}");
}
