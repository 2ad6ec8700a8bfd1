//! A dependent waits for every parent, and the finish of its last parent
//! releases it: across parents, within one enqueue, and for many dependents.

use super::*;

#[test]
fn a_dependent_waits_for_every_parent_and_the_last_ones_finish_releases_it() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let a = enqueue(&mut conn, 1, &JobOptions::default());
    let b = enqueue(&mut conn, 2, &JobOptions::default());
    let child = enqueue(&mut conn, 3, &JobOptions::default().depends_on([a, b]));
    assert_eq!(waiting_on(&mut conn, child), vec![a, b]);
    assert_eq!(
        waiting_on(&mut conn, a),
        Vec::<i64>::new(),
        "empty when none"
    );

    let parents = claim(&mut conn, 10);
    assert_eq!(
        parents.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![a, b],
        "the child is not claimable"
    );
    assert_eq!(finish(&mut conn, &parents[0], done()), 0);
    assert_eq!(waiting_on(&mut conn, child), vec![b]);
    assert!(claim(&mut conn, 10).is_empty(), "one parent left");
    assert_eq!(finish(&mut conn, &parents[1], done()), 1, "released");
    assert_eq!(waiting_on(&mut conn, child), Vec::<i64>::new());
    let claimed = claim(&mut conn, 10);
    assert_eq!(
        claimed.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![child]
    );
    let ctx = JobContext::new(&claimed[0], CancellationToken::new());
    assert!(ctx.unfinished_parents().is_empty());

    // A parent already done when the dependent is enqueued is not waited for.
    let late = enqueue(&mut conn, 4, &JobOptions::default().depends_on([a]));
    assert_eq!(waiting_on(&mut conn, late), Vec::<i64>::new());
    let depends_on: Option<Vec<i64>> = jobs_all::table
        .find(late)
        .select(jobs_all::depends_on)
        .first(&mut conn)
        .expect("the job");
    assert_eq!(depends_on, Some(vec![a]));
}

#[test]
fn jobs_of_one_enqueue_can_wait_for_each_other() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let jobs = [
        NewJob::for_args(
            &Step { n: 1 },
            &JobOptions::default().depends_on([Parent::InBatch(1)]),
        )
        .expect("job"),
        NewJob::for_args(&Step { n: 2 }, &JobOptions::default()).expect("job"),
    ];
    let ids = Enqueuer::new()
        .enqueue_many(&mut conn, &jobs)
        .expect("enqueue");
    assert!(ids[0] < ids[1], "ids in enqueue order: {ids:?}");
    assert_eq!(waiting_on(&mut conn, ids[0]), vec![ids[1]]);
    let claimed = claim(&mut conn, 10);
    assert_eq!(
        claimed.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![ids[1]]
    );
    finish(&mut conn, &claimed[0], done());
    assert_eq!(claim_ids(&mut conn), vec![ids[0]]);
}

/// One parent with many dependents, half of each policy: the parent's own
/// finish releases every one of them, in that statement, each once. A
/// release that walks its dependents one by one, or compares each with every
/// other, shows here as a finish that takes seconds.
#[test]
fn one_parent_with_10_000_dependents_releases_each_once_in_its_finish() {
    const CHILDREN: usize = 10_000;
    let db = TestDb::new();
    let mut conn = db.conn();
    let parent = enqueue(&mut conn, 0, &JobOptions::default());
    let children: Vec<NewJob> = (0..CHILDREN)
        .map(|i| {
            let policy = if i % 2 == 0 {
                DependencyPolicy::Hold
            } else {
                DependencyPolicy::Run
            };
            let options = JobOptions::default()
                .depends_on([parent])
                .dependency_policy(policy);
            NewJob::for_args(&Step { n: i as i64 + 1 }, &options).expect("job")
        })
        .collect();
    let started = std::time::Instant::now();
    let mut child_ids = Enqueuer::new()
        .enqueue_many(&mut conn, &children)
        .expect("enqueue");
    let enqueue_took = started.elapsed();
    child_ids.sort_unstable();
    assert_eq!(child_ids.len(), CHILDREN);

    let claimed = claim(&mut conn, 100);
    assert_eq!(
        claimed.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![parent],
        "no dependent is claimable before its parent ends"
    );
    let started = std::time::Instant::now();
    let released = finish(&mut conn, &claimed[0], done());
    let finish_took = started.elapsed();
    eprintln!(
        "{CHILDREN} dependents: enqueued in {enqueue_took:?}, released by one finish in \
         {finish_took:?}"
    );
    assert_eq!(released, CHILDREN, "every dependent released by the finish");
    let still_waiting: i64 = jobs::table
        .filter(jobs::waiting_on.ne(Vec::<i64>::new()))
        .count()
        .get_result(&mut conn)
        .expect("count");
    assert_eq!(still_waiting, 0);

    // Each claimable exactly once: claims until one comes back empty.
    let mut seen: Vec<i64> = Vec::with_capacity(CHILDREN);
    loop {
        let batch = claim(&mut conn, 1_000);
        if batch.is_empty() {
            break;
        }
        assert!(
            batch.iter().all(|j| j.unfinished_parents.is_none()),
            "a parent that ended done is no unfinished parent"
        );
        seen.extend(batch.iter().map(|j| j.id));
    }
    seen.sort_unstable();
    assert_eq!(seen, child_ids, "every dependent claimed, each once");
    // Generous for a debug build on a busy machine: what it catches is a
    // release that costs per dependent pair, not a slow moment.
    assert!(
        finish_took < Duration::from_secs(10),
        "one finish took {finish_took:?} to release {CHILDREN} dependents"
    );
}

/// The job's `has_dependents`: true, false, or not known (NULL).
fn marked(conn: &mut PgConnection, id: i64) -> Option<bool> {
    jobs_all::table
        .find(id)
        .select(jobs_all::has_dependents)
        .first(conn)
        .expect("the job")
}

/// The finish does not look for dependents of a parent known to have none.
/// The enqueue marks its parents, within one enqueue or across two, and
/// writes every other job known to have none. A plain INSERT that knows
/// nothing of the mark (an application's own statement, or an older build
/// still running while a deployment rolls out) leaves its own row not known,
/// and the table's trigger marks the parents it names, even one the enqueue
/// wrote as having none. The mark follows a parent into the archive.
#[test]
fn every_writer_of_a_dependent_marks_its_parents_and_the_finish_releases_it() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lonely = enqueue(&mut conn, 1, &JobOptions::default());
    let earlier = enqueue(&mut conn, 2, &JobOptions::default());
    let by_enqueue = enqueue(&mut conn, 3, &JobOptions::default().depends_on([earlier]));
    let batch = Enqueuer::new()
        .enqueue_many(
            &mut conn,
            &[
                NewJob::for_args(&Step { n: 4 }, &JobOptions::default()).expect("job"),
                NewJob::for_args(
                    &Step { n: 5 },
                    &JobOptions::default().depends_on([Parent::InBatch(0)]),
                )
                .expect("job"),
            ],
        )
        .expect("enqueue");
    let plain_parent = enqueue(&mut conn, 6, &JobOptions::default());
    let by_insert: i64 = diesel::insert_into(jobs::table)
        .values((
            jobs::kind.eq(Step::KIND),
            jobs::payload.eq(serde_json::json!({"n": 7})),
            jobs::waiting_on.eq(vec![plain_parent]),
            jobs::depends_on.eq(Some(vec![plain_parent])),
            jobs::dependency_policy.eq(Some("hold")),
        ))
        .returning(jobs::id)
        .get_result(&mut conn)
        .expect("a plain insert");

    assert_eq!(marked(&mut conn, lonely), Some(false));
    assert_eq!(marked(&mut conn, earlier), Some(true));
    assert_eq!(marked(&mut conn, by_enqueue), Some(false));
    assert_eq!(marked(&mut conn, batch[0]), Some(true));
    assert_eq!(marked(&mut conn, batch[1]), Some(false));
    assert_eq!(
        marked(&mut conn, plain_parent),
        Some(true),
        "by the trigger"
    );
    assert_eq!(marked(&mut conn, by_insert), None, "not known");

    let parents = claim(&mut conn, 10);
    assert_eq!(
        parents.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![lonely, earlier, batch[0], plain_parent]
    );
    let finishes: Vec<Finish> = parents
        .iter()
        .map(|job| Finish {
            job_id: job.id,
            lease_token: job.lease_token,
            outcome: done(),
        })
        .collect();
    let report = finish_jobs(&mut conn, &finishes).expect("finish");
    assert_eq!(report.released, 3, "{report:?}");
    for child in [by_enqueue, batch[1], by_insert] {
        assert_eq!(waiting_on(&mut conn, child), Vec::<i64>::new());
    }
    assert_eq!(
        marked(&mut conn, earlier),
        Some(true),
        "archived with its mark"
    );
    assert_eq!(marked(&mut conn, lonely), Some(false));
}
