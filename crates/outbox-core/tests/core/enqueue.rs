//! Enqueueing in the caller's transaction: atomicity, ordering keys, wake-ups.

use diesel::prelude::*;
use outbox_core::outbox::{Enqueuer, JobOptions, NewJob, Waker};
use outbox_core::schema::jobs;
use outbox_core::worker::JobArgs;
use serde::{Deserialize, Serialize};

use crate::support::TestDb;

#[derive(Debug, Serialize, Deserialize)]
struct Ping {
    n: i64,
}

impl JobArgs for Ping {
    const KIND: &'static str = "ping";
}

fn job_count(conn: &mut PgConnection) -> i64 {
    jobs::table.count().get_result(conn).expect("count")
}

/// `(id, blocked)` of every job, in id order.
fn blocked_flags(conn: &mut PgConnection) -> Vec<(i64, bool)> {
    jobs::table
        .select((jobs::id, jobs::blocked))
        .order(jobs::id)
        .load(conn)
        .expect("jobs")
}

#[test]
fn a_typed_enqueue_in_a_transaction_that_rolls_back_leaves_nothing() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let enqueuer = Enqueuer::new();

    let rolled_back = conn.transaction(|conn| -> QueryResult<()> {
        enqueuer.enqueue(conn, &Ping { n: 1 }, &JobOptions::default())?;
        Err(diesel::result::Error::RollbackTransaction)
    });
    assert!(rolled_back.is_err());
    assert_eq!(job_count(&mut conn), 0, "the job went with the transaction");

    let id = conn
        .transaction(|conn| enqueuer.enqueue(conn, &Ping { n: 2 }, &JobOptions::default()))
        .expect("committed enqueue");
    let (kind, payload, max_attempts): (String, serde_json::Value, i32) = jobs::table
        .find(id)
        .select((jobs::kind, jobs::payload, jobs::max_attempts))
        .first(&mut conn)
        .expect("the committed job");
    assert_eq!(kind, "ping");
    assert_eq!(payload, serde_json::json!({ "n": 2 }));
    assert_eq!(max_attempts, outbox_core::outbox::DEFAULT_MAX_ATTEMPTS);
}

#[test]
fn enqueue_many_queues_each_keyed_job_behind_its_keys_unfinished_jobs() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let enqueuer = Enqueuer::new();
    let keyed = |key: &str, n: i64| {
        NewJob::for_args(&Ping { n }, &JobOptions::default().ordering_key(key)).expect("job")
    };

    let first = enqueuer
        .enqueue_many(
            &mut conn,
            &[
                keyed("a", 1),
                keyed("a", 2),
                keyed("b", 3),
                NewJob::new("ping", serde_json::json!({ "n": 4 })),
            ],
        )
        .expect("first batch");
    let later = enqueuer
        .enqueue_many(&mut conn, &[keyed("a", 5), keyed("c", 6)])
        .expect("second batch");

    assert_eq!(first.len(), 4);
    assert!(
        first.windows(2).all(|w| w[0] < w[1]),
        "ids in enqueue order"
    );
    let expected: Vec<(i64, bool)> = vec![
        (first[0], false), // a's head
        (first[1], true),  // behind a's head in the same batch
        (first[2], false), // b's head
        (first[3], false), // no key
        (later[0], true),  // behind a's unfinished jobs
        (later[1], false), // c's head
    ];
    assert_eq!(blocked_flags(&mut conn), expected);
}

#[test]
fn jobs_under_a_new_key_skip_the_lookup_and_still_queue_one_behind_another() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let enqueuer = Enqueuer::new();
    let options = JobOptions::default().new_ordering_key("invoice-1");

    let ids = conn
        .transaction(|conn| {
            let jobs = [
                NewJob::for_args(&Ping { n: 1 }, &options).expect("job"),
                NewJob::for_args(&Ping { n: 2 }, &options).expect("job"),
            ];
            enqueuer.enqueue_many(conn, &jobs)
        })
        .expect("enqueue");

    assert_eq!(
        blocked_flags(&mut conn),
        vec![(ids[0], false), (ids[1], true)]
    );
}

#[test]
fn an_enqueuer_that_wakes_after_commit_keeps_a_rolled_back_job_out() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let enqueuer = Enqueuer::new().wake_after_commit(Waker::new());

    let rolled_back = enqueuer.transaction(&mut conn, |conn| -> QueryResult<()> {
        enqueuer.enqueue(conn, &Ping { n: 1 }, &JobOptions::default())?;
        Err(diesel::result::Error::RollbackTransaction)
    });
    assert!(rolled_back.is_err());
    assert_eq!(job_count(&mut conn), 0);

    enqueuer
        .transaction(&mut conn, |conn| {
            enqueuer.enqueue(conn, &Ping { n: 2 }, &JobOptions::default())
        })
        .expect("committed");
    assert_eq!(job_count(&mut conn), 1);
}

/// An application's [`outbox_core::outbox::InsertJobs`] that writes kind and
/// payload with two arrays, and refuses the job whose `n` is 5,500.
fn insert_refusing_5500(conn: &mut PgConnection, new_jobs: &[NewJob]) -> QueryResult<Vec<i64>> {
    #[derive(QueryableByName)]
    struct Id {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        id: i64,
    }
    assert!(
        new_jobs.len() <= outbox_core::outbox::INSERT_CHUNK,
        "{} jobs in one call",
        new_jobs.len()
    );
    if new_jobs
        .iter()
        .any(|j| j.payload()["n"] == serde_json::json!(5_500))
    {
        return Err(diesel::result::Error::RollbackTransaction);
    }
    let kinds: Vec<&str> = new_jobs.iter().map(NewJob::kind).collect();
    let payloads: Vec<&serde_json::Value> = new_jobs.iter().map(NewJob::payload).collect();
    let ids: Vec<Id> = diesel::sql_query(
        "INSERT INTO jobs (kind, payload) \
         SELECT k, p FROM unnest($1::text[], $2::jsonb[]) WITH ORDINALITY AS r(k, p, i) \
         ORDER BY i RETURNING id",
    )
    .bind::<diesel::sql_types::Array<diesel::sql_types::Text>, _>(&kinds)
    .bind::<diesel::sql_types::Array<diesel::sql_types::Jsonb>, _>(&payloads)
    .load(conn)?;
    Ok(ids.into_iter().map(|r| r.id).collect())
}

/// More jobs than one INSERT may bind (PostgreSQL takes 65,535 parameters
/// a statement, and each of these jobs binds several):
/// written in several INSERTs, in order, and outside a transaction all or
/// nothing.
#[test]
fn an_enqueue_of_more_jobs_than_one_insert_binds_writes_them_all_or_none() {
    const JOBS: i64 = 15_000;
    let db = TestDb::new();
    let mut conn = db.conn();
    let new_jobs: Vec<NewJob> = (0..JOBS)
        .map(|n| NewJob::for_args(&Ping { n }, &JobOptions::default()).expect("job"))
        .collect();

    let refused = Enqueuer::new()
        .insert_with(insert_refusing_5500)
        .enqueue_many(&mut conn, &new_jobs);
    assert!(refused.is_err(), "the third INSERT is refused");
    assert_eq!(job_count(&mut conn), 0, "the first two went with it");

    let ids = Enqueuer::new()
        .enqueue_many(&mut conn, &new_jobs)
        .expect("enqueue");
    assert_eq!(ids.len() as i64, JOBS);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids in enqueue order");
    let ns: Vec<serde_json::Value> = jobs::table
        .select(jobs::payload)
        .order(jobs::id)
        .load(&mut conn)
        .expect("payloads");
    assert!(
        ns.iter()
            .enumerate()
            .all(|(i, p)| p["n"] == serde_json::json!(i)),
        "rows in enqueue order"
    );
}
