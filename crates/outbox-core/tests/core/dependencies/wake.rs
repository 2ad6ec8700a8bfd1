//! Who hears of a dependent its parent's finish released: the worker pool
//! that finished the parent claims one of its own kinds at once, and tells
//! nobody; one of another kind is announced after the finish committed, so
//! the finish's commit never holds PostgreSQL's notify lock.

use std::collections::BTreeSet;
use std::time::Instant;

use super::*;
use crate::support::listening;

#[derive(Debug, Serialize, Deserialize)]
struct Follow {
    n: i64,
}

impl JobArgs for Follow {
    const KIND: &'static str = "follow";
}

/// Notes the jobs it ran.
#[derive(Clone, Default)]
struct Ran(Arc<Mutex<Vec<i64>>>);

impl Ran {
    fn ids(&self) -> Vec<i64> {
        self.0.lock().expect("runs").clone()
    }
}

impl Worker<Step> for Ran {
    async fn work(&self, _args: Step, ctx: JobContext) -> EffectResult {
        self.0.lock().expect("runs").push(ctx.id());
        Ok(None)
    }
}

impl Worker<Follow> for Ran {
    async fn work(&self, _args: Follow, ctx: JobContext) -> EffectResult {
        self.0.lock().expect("runs").push(ctx.id());
        Ok(None)
    }
}

/// A `step` and a `follow` that waits for it, enqueued together.
fn parent_and_child(conn: &mut PgConnection) -> (i64, i64) {
    let jobs = [
        NewJob::for_args(&Step { n: 1 }, &JobOptions::default()).expect("job"),
        NewJob::for_args(
            &Follow { n: 2 },
            &JobOptions::default().depends_on([Parent::InBatch(0)]),
        )
        .expect("job"),
    ];
    let ids = Enqueuer::new().enqueue_many(conn, &jobs).expect("enqueue");
    (ids[0], ids[1])
}

/// The payloads of the NOTIFYs `conn` (which LISTENs) got so far.
fn notified(conn: &mut PgConnection) -> BTreeSet<String> {
    // Notifications arrive with a statement's answer: run one.
    diesel::sql_query("SELECT 1").execute(conn).expect("poll");
    conn.notifications_iter()
        .map(|n| n.expect("a notification").payload)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependent_of_the_finishing_pools_own_kind_runs_at_once_and_is_announced_to_nobody() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let (parent, child) = parent_and_child(&mut conn);
    let mut listener = db.conn();
    diesel::sql_query("LISTEN outbox_jobs")
        .execute(&mut listener)
        .expect("listen");

    let ran = Ran::default();
    let workers = Workers::new()
        .register::<Step, _>(ran.clone())
        .register::<Follow, _>(ran.clone());
    let mut settings = settings("both", &workers);
    // Only a wake-up can start the child in time.
    settings.poll_interval = Duration::from_secs(30);
    let relay = spawn_relay(&db, settings, workers);
    wait_until("both ran", Duration::from_secs(10), || ran.ids().len() == 2).await;
    relay.stop().await;

    assert_eq!(ran.ids(), vec![parent, child]);
    assert_eq!(notified(&mut listener), BTreeSet::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependent_of_another_kind_wakes_its_worker_pool_after_the_parents_finish() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let ran = Ran::default();
    let followers = Workers::new().register::<Follow, _>(ran.clone());
    let mut settings_b = settings("followers", &followers);
    settings_b.poll_interval = Duration::from_secs(30);
    let follower_pool = spawn_relay(&db, settings_b, followers);
    // Its first claim (at start) found nothing; it now waits on LISTEN.
    wait_until("the follower pool listens", Duration::from_secs(10), || {
        listening(&mut conn)
    })
    .await;
    let (parent, child) = parent_and_child(&mut conn);

    let steps = Workers::new().register::<Step, _>(ran.clone());
    let step_pool = spawn_relay(&db, settings("steps", &steps), steps);
    let started = Instant::now();
    wait_until("the child ran", Duration::from_secs(20), || {
        ran.ids().contains(&child)
    })
    .await;
    let took = started.elapsed();
    step_pool.stop().await;
    follower_pool.stop().await;

    assert_eq!(ran.ids(), vec![parent, child]);
    assert!(
        took < Duration::from_secs(10),
        "the child started {took:?} after its parent's pool did; the follower pool polls every 30 s"
    );
}
