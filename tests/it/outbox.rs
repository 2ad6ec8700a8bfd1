//! The queue statements on their own: claim, fencing, reaping, release, admin.

use crate::support::enqueue_many;
use std::collections::HashSet;
use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::Text;
use order_service::effects::receipt::store_receipt;
use order_service::orders::OrderId;
use order_service::outbox::NewJob;
use order_service::outbox_core::statements::{
    ClaimRequest, Finish, JobLease, Outcome, ReapRequest, claim_jobs, extend_leases, finish_jobs,
    hand_back_jobs, reap_expired_leases,
};
use order_service::schema::jobs_all;

use crate::support::{TestDb, claim_buffers, count};

fn noops(conn: &mut PgConnection, n: usize) -> Vec<i64> {
    let batch: Vec<NewJob> = (0..n)
        .map(|i| NewJob::new("noop", serde_json::json!({ "i": i })))
        .collect();
    enqueue_many(conn, &batch).expect("enqueue")
}

fn claim(
    conn: &mut PgConnection,
    worker: &str,
    limit: i64,
    lease: Duration,
) -> Vec<order_service::outbox_core::statements::ClaimedJob> {
    let kinds = vec!["noop".to_owned()];
    claim_jobs(
        conn,
        &ClaimRequest {
            worker_id: worker,
            kinds: &kinds,
            limit,
            lease,
        },
    )
    .expect("claim")
}

/// Makes every processing job's lease expired, as if its worker had died long ago.
fn expire_leases(conn: &mut PgConnection) {
    diesel::sql_query("UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE status = 'processing'")
        .execute(conn)
        .expect("expire leases");
}

#[derive(QueryableByName)]
struct PlanLine {
    #[diesel(sql_type = Text, column_name = "QUERY PLAN")]
    line: String,
}

/// Whether `plan` sorts jobs: a sort on the claim order. The claim also reads
/// the concurrency keys' small table (job_concurrency_keys), which the planner
/// may sort and scan whole while it has few rows; that is not the jobs table.
fn sorts_jobs(plan: &str) -> bool {
    plan.lines()
        .any(|line| line.contains("Sort Key") && line.contains("run_after"))
}

/// Whether `plan` reads the whole jobs table.
fn scans_jobs(plan: &str) -> bool {
    plan.lines()
        .any(|line| line.contains("Seq Scan on jobs") && !line.contains("Seq Scan on jobs_"))
}

/// The claim's plan, on a table where most rows are finished: an index scan of
/// jobs_claim_idx in (run_after, id) order, stopped by the LIMIT, with no sort
/// and no walk of the primary key. Seen on PostgreSQL 15:
///
/// ```text
/// Update on jobs j
///   CTE async_commit
///     ->  Result
///   CTE picked
///     ->  Limit
///           ->  LockRows
///                 ->  Index Scan using jobs_claim_idx on jobs
///                       Index Cond: (run_after <= now())
///                       Filter: ((kind = ANY ('{noop}'::text[])) AND (status = 'pending'::text))
///   ->  Nested Loop
///         ->  CTE Scan on async_commit
///         ->  Nested Loop
///               ->  CTE Scan on picked
///               ->  Index Scan using jobs_pkey on jobs j
///                     Index Cond: (id = picked.id)
/// ```
#[test]
fn the_claim_reads_its_partial_index_in_order_and_skips_finished_rows() {
    let db = TestDb::new();
    let mut conn = db.conn();
    diesel::sql_query(
        "INSERT INTO jobs (kind, status, finished_at) \
         SELECT 'noop', 'failed', now() FROM generate_series(1, 20000)",
    )
    .execute(&mut conn)
    .expect("done rows");
    noops(&mut conn, 200);
    diesel::sql_query("ANALYZE jobs")
        .execute(&mut conn)
        .expect("analyze");

    let explain = format!(
        "EXPLAIN {}",
        include_str!("../../crates/outbox-core/src/outbox/sql/claim_jobs.sql")
            .replace("$1", "16")
            .replace("$2", "ARRAY['noop']")
            .replace("$3", "'w'")
            .replace("$4", "60000")
            .replace("$5", "NULL")
            .replace("$6", "0")
    );
    let plan: Vec<String> = diesel::sql_query(explain)
        .load::<PlanLine>(&mut conn)
        .expect("explain")
        .into_iter()
        .map(|l| l.line)
        .collect();
    let plan = plan.join("\n");
    println!("{plan}");
    assert!(
        plan.contains("Index Scan using jobs_claim_idx"),
        "claim does not use its index:\n{plan}"
    );
    assert!(
        !sorts_jobs(&plan),
        "claim sorts instead of reading the index in order:\n{plan}"
    );
    assert!(!scans_jobs(&plan), "claim scans the table:\n{plan}");
}

#[test]
fn a_claim_takes_due_jobs_of_its_kinds_oldest_first_and_counts_the_attempt() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let ids = noops(&mut conn, 5);
    enqueue_many(&mut conn, &[NewJob::new("other", serde_json::json!({}))]).expect("other kind");
    enqueue_many(
        &mut conn,
        &[NewJob::new("noop", serde_json::json!({})).with_options(
            &order_service::outbox::JobOptions::default()
                .run_after(chrono::Utc::now() + chrono::Duration::hours(1)),
        )],
    )
    .expect("future job");

    let claimed = claim(&mut conn, "w1", 3, Duration::from_secs(60));
    assert_eq!(claimed.iter().map(|j| j.id).collect::<Vec<_>>().len(), 3);
    assert!(
        claimed
            .iter()
            .all(|j| j.attempt == 1 && ids[..3].contains(&j.id))
    );

    let rest = claim(&mut conn, "w2", 100, Duration::from_secs(60));
    let rest_ids: HashSet<i64> = rest.iter().map(|j| j.id).collect();
    assert_eq!(
        rest_ids,
        ids[3..].iter().copied().collect(),
        "only due noop jobs are claimed"
    );
    let (locked_by, lease): (Option<String>, Option<chrono::DateTime<chrono::Utc>>) =
        jobs_all::table
            .find(ids[4])
            .select((jobs_all::locked_by, jobs_all::lease_expires_at))
            .first(&mut conn)
            .expect("job");
    assert_eq!(locked_by.as_deref(), Some("w2"));
    assert!(lease.expect("lease set") > chrono::Utc::now() + chrono::Duration::seconds(50));
}

#[derive(QueryableByName)]
struct Setting {
    #[diesel(sql_type = Text)]
    synchronous_commit: String,
}

fn synchronous_commit(conn: &mut PgConnection) -> String {
    diesel::sql_query("SHOW synchronous_commit")
        .get_result::<Setting>(conn)
        .expect("show")
        .synchronous_commit
}

/// The claim skips the WAL flush for its own transaction and nothing else: the
/// connection goes back to the pool with the server's setting, so an order
/// written on it later still commits durably.
#[test]
fn a_claim_commits_asynchronously_without_changing_the_sessions_setting() {
    let db = TestDb::new();
    let mut conn = db.conn();
    noops(&mut conn, 2);
    // The session's own setting, whatever the server's: the tests' private
    // server runs with synchronous_commit off for speed.
    diesel::sql_query("SET synchronous_commit = on")
        .execute(&mut conn)
        .expect("set");
    assert_eq!(synchronous_commit(&mut conn), "on");

    assert_eq!(claim(&mut conn, "w", 1, Duration::from_secs(60)).len(), 1);
    assert_eq!(
        synchronous_commit(&mut conn),
        "on",
        "the session keeps its setting"
    );

    let inside = conn
        .transaction(|conn| {
            let claimed = claim(conn, "w", 1, Duration::from_secs(60));
            QueryResult::Ok((claimed.len(), synchronous_commit(conn)))
        })
        .expect("transaction");
    assert_eq!(
        inside,
        (1, "off".to_owned()),
        "the claim's transaction commits asynchronously"
    );
    assert_eq!(synchronous_commit(&mut conn), "on");
}

#[test]
fn concurrent_claims_never_hand_out_the_same_job() {
    let db = TestDb::new();
    noops(&mut db.conn(), 3000);

    let threads: Vec<_> = (0..6)
        .map(|w| {
            let url = db.url.clone();
            std::thread::spawn(move || {
                let mut conn = PgConnection::establish(&url).expect("connect");
                let mut mine = Vec::new();
                loop {
                    let got = claim(&mut conn, &format!("w{w}"), 7, Duration::from_secs(60));
                    if got.is_empty() {
                        return mine;
                    }
                    mine.extend(got.into_iter().map(|j| j.id));
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in threads {
        all.extend(t.join().expect("claimer thread"));
    }
    let unique: HashSet<i64> = all.iter().copied().collect();
    assert_eq!(all.len(), 3000, "every job claimed");
    assert_eq!(unique.len(), 3000, "no job claimed twice");
}

#[test]
fn a_zombies_late_completion_and_failure_change_nothing() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let id = noops(&mut conn, 1)[0];

    let zombie = claim(&mut conn, "zombie", 1, Duration::from_secs(60)).remove(0);
    expire_leases(&mut conn);
    let reaped =
        reap_expired_leases(&mut conn, &ReapRequest::new(100), |_| Duration::ZERO).expect("reap");
    assert_eq!(reaped.requeued, 1);
    let owner = claim(&mut conn, "owner", 1, Duration::from_secs(60)).remove(0);
    assert_eq!((owner.id, owner.attempt), (id, 2));

    assert!(owner.lease_token > zombie.lease_token, "tokens only grow");

    let late = |outcome: Outcome| Finish {
        job_id: id,
        lease_token: zombie.lease_token,
        outcome,
    };
    let receipt = Outcome::Done {
        local: Some(store_receipt(OrderId::new(1), vec![1])),
    };
    let failed = Outcome::Failed {
        error: "late".into(),
    };
    for outcome in [Outcome::Done { local: None }, failed, receipt] {
        let report = finish_jobs(&mut conn, &[late(outcome)]).expect("finish");
        assert_eq!(report.applied, Vec::<i64>::new());
        assert_eq!(report.lost, vec![id]);
    }
    let heartbeat = extend_leases(
        &mut conn,
        &[JobLease {
            job_id: id,
            lease_token: zombie.lease_token,
        }],
        Duration::from_secs(60),
    )
    .expect("heartbeat");
    assert!(heartbeat.extended.is_empty() && heartbeat.busy.is_empty());
    assert_eq!(heartbeat.lost.len(), 1);

    let (status, locked_by): (String, Option<String>) = jobs_all::table
        .find(id)
        .select((jobs_all::status, jobs_all::locked_by))
        .first(&mut conn)
        .expect("job");
    assert_eq!(
        (status.as_str(), locked_by.as_deref()),
        ("processing", Some("owner"))
    );

    let ok = Finish {
        job_id: id,
        lease_token: owner.lease_token,
        outcome: Outcome::Done { local: None },
    };
    assert_eq!(
        finish_jobs(&mut conn, &[ok]).expect("finish").applied,
        vec![id]
    );
    assert_eq!(count(&mut conn, "done"), 1);
}

#[test]
fn an_expired_lease_is_reaped_to_pending_or_to_failed_when_out_of_attempts() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let with_attempts_left = enqueue_many(
        &mut conn,
        &[NewJob::new("noop", serde_json::json!({}))
            .with_options(&order_service::outbox::JobOptions::default().max_attempts(3))],
    )
    .expect("enqueue")[0];
    let on_last_attempt = enqueue_many(
        &mut conn,
        &[NewJob::new("noop", serde_json::json!({}))
            .with_options(&order_service::outbox::JobOptions::default().max_attempts(1))],
    )
    .expect("enqueue")[0];
    let healthy = noops(&mut conn, 1)[0];
    claim(&mut conn, "dead", 2, Duration::from_secs(60));
    expire_leases(&mut conn);
    claim(&mut conn, "alive", 1, Duration::from_secs(60));

    let report = reap_expired_leases(&mut conn, &ReapRequest::new(100), |_| {
        Duration::from_secs(5)
    })
    .expect("reap");
    assert_eq!((report.requeued, report.failed), (1, 1));
    let rows: Vec<(i64, String, Option<String>, chrono::DateTime<chrono::Utc>)> = jobs_all::table
        .select((
            jobs_all::id,
            jobs_all::status,
            jobs_all::last_error,
            jobs_all::run_after,
        ))
        .order(jobs_all::id)
        .load(&mut conn)
        .expect("jobs");
    let by_id = |id: i64| rows.iter().find(|r| r.0 == id).expect("row").clone();

    let requeued = by_id(with_attempts_left);
    assert_eq!(requeued.1, "pending");
    assert!(
        requeued
            .2
            .as_deref()
            .is_some_and(|e| e.contains("lease expired") && e.contains("dead"))
    );
    assert!(
        requeued.3 > chrono::Utc::now() + chrono::Duration::seconds(3),
        "requeued with backoff"
    );
    let failed = by_id(on_last_attempt);
    assert_eq!(failed.1, "failed");
    assert!(
        failed
            .2
            .as_deref()
            .is_some_and(|e| e.contains("no attempts left"))
    );
    assert_eq!(by_id(healthy).1, "processing", "a live lease is left alone");
    assert_eq!(
        reap_expired_leases(&mut conn, &ReapRequest::new(100), |_| Duration::ZERO)
            .expect("reap")
            .total(),
        0
    );
}

#[test]
fn handed_back_jobs_go_back_to_pending_without_spending_an_attempt() {
    let db = TestDb::new();
    let mut conn = db.conn();
    noops(&mut conn, 2);
    let claimed = claim(&mut conn, "w", 2, Duration::from_secs(60));
    let leases: Vec<JobLease> = claimed
        .iter()
        .map(|j| JobLease {
            job_id: j.id,
            lease_token: j.lease_token,
        })
        .collect();
    let forged: Vec<JobLease> = leases
        .iter()
        .map(|l| JobLease {
            lease_token: l.lease_token + 1_000,
            ..*l
        })
        .collect();

    assert!(
        hand_back_jobs(&mut conn, &forged)
            .expect("release")
            .is_empty(),
        "a token no claim holds releases nothing"
    );
    assert_eq!(
        hand_back_jobs(&mut conn, &leases).expect("release").len(),
        2
    );

    let rows: Vec<(String, i32, Option<String>)> = jobs_all::table
        .select((jobs_all::status, jobs_all::attempts, jobs_all::locked_by))
        .load(&mut conn)
        .expect("jobs");
    assert!(
        rows.iter().all(|r| r == &("pending".to_owned(), 0, None)),
        "{rows:?}"
    );
}

#[test]
fn a_retry_outcome_schedules_the_job_and_keeps_the_error() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let id = noops(&mut conn, 1)[0];
    let job = claim(&mut conn, "w", 1, Duration::from_secs(60)).remove(0);

    let retry = Finish {
        job_id: id,
        lease_token: job.lease_token,
        outcome: Outcome::Retry {
            delay: Duration::from_secs(30),
            error: "503 from receiver".into(),
        },
    };
    assert_eq!(
        finish_jobs(&mut conn, &[retry]).expect("finish").applied,
        vec![id]
    );

    let (status, run_after, last_error, locked_by): (
        String,
        chrono::DateTime<chrono::Utc>,
        Option<String>,
        Option<String>,
    ) = jobs_all::table
        .find(id)
        .select((
            jobs_all::status,
            jobs_all::run_after,
            jobs_all::last_error,
            jobs_all::locked_by,
        ))
        .first(&mut conn)
        .expect("job");
    assert_eq!(status, "pending");
    assert_eq!(last_error.as_deref(), Some("503 from receiver"));
    assert_eq!(locked_by, None);
    let wait = run_after - chrono::Utc::now();
    assert!(
        wait > chrono::Duration::seconds(25) && wait <= chrono::Duration::seconds(31),
        "{wait}"
    );
    assert!(
        claim(&mut conn, "w", 1, Duration::from_secs(60)).is_empty(),
        "not due yet"
    );
}

/// A relay that claims one rare kind while another kind has a large backlog
/// goes straight to its own jobs (jobs_kind_claim_idx) instead of stepping over
/// the backlog; the ordered walk of jobs_claim_idx stays the plan for the
/// backlog's own kind.
#[test]
fn a_claim_for_a_rare_kind_does_not_walk_another_kinds_backlog() {
    let db = TestDb::new();
    let mut conn = db.conn();
    diesel::sql_query(
        "INSERT INTO jobs (kind) SELECT 'order_webhook' FROM generate_series(1, 20000)",
    )
    .execute(&mut conn)
    .expect("backlog");
    diesel::sql_query(
        "INSERT INTO jobs (kind) SELECT 'confirmation_email' FROM generate_series(1, 50)",
    )
    .execute(&mut conn)
    .expect("rare kind");
    diesel::sql_query("ANALYZE jobs")
        .execute(&mut conn)
        .expect("analyze");

    let plan_for = |conn: &mut PgConnection, kinds: &str| -> String {
        let explain = format!(
            "EXPLAIN {}",
            include_str!("../../crates/outbox-core/src/outbox/sql/claim_jobs.sql")
                .replace("$1", "16")
                .replace("$2", kinds)
                .replace("$3", "'w'")
                .replace("$4", "60000")
                .replace("$5", "NULL")
                .replace("$6", "0")
        );
        diesel::sql_query(explain)
            .load::<PlanLine>(conn)
            .expect("explain")
            .into_iter()
            .map(|l| l.line)
            .collect::<Vec<_>>()
            .join("\n")
    };
    let rare = plan_for(&mut conn, "ARRAY['confirmation_email']");
    assert!(rare.contains("jobs_kind_claim_idx"), "rare kind:\n{rare}");
    let backlog = plan_for(&mut conn, "ARRAY['order_webhook']");
    assert!(
        backlog.contains("Index Scan using jobs_claim_idx") && !sorts_jobs(&backlog),
        "backlog kind:\n{backlog}"
    );

    let kinds = vec!["confirmation_email".to_owned()];
    let claimed = claim_jobs(
        &mut conn,
        &ClaimRequest {
            worker_id: "mail",
            kinds: &kinds,
            limit: 16,
            lease: Duration::from_secs(60),
        },
    )
    .expect("claim");
    assert_eq!(claimed.len(), 16);
    assert!(claimed.iter().all(|j| j.kind == "confirmation_email"));
}

/// The old fence, (locked_by, attempts), repeated after a release or an
/// operator retry; the lease token of a claim never does.
#[test]
fn a_claim_after_a_release_or_an_operator_retry_fences_out_the_earlier_claim_of_the_same_worker() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let id = noops(&mut conn, 1)[0];
    let done = |token: i64| Finish {
        job_id: id,
        lease_token: token,
        outcome: Outcome::Done { local: None },
    };

    // Released at shutdown: attempts goes back to 0, and the same worker's
    // next claim is attempt 1 again.
    let first = claim(&mut conn, "w", 1, Duration::from_secs(60)).remove(0);
    let lease = JobLease {
        job_id: id,
        lease_token: first.lease_token,
    };
    assert_eq!(
        hand_back_jobs(&mut conn, &[lease]).expect("release"),
        vec![id]
    );
    let second = claim(&mut conn, "w", 1, Duration::from_secs(60)).remove(0);
    assert_eq!((first.attempt, second.attempt), (1, 1));
    assert_eq!(
        finish_jobs(&mut conn, &[done(first.lease_token)])
            .expect("finish")
            .lost,
        vec![id]
    );

    // Failed, then retried by an operator: attempts reset to 0 again.
    let failed = Finish {
        job_id: id,
        lease_token: second.lease_token,
        outcome: Outcome::Failed {
            error: "550".into(),
        },
    };
    assert_eq!(
        finish_jobs(&mut conn, &[failed]).expect("finish").applied,
        vec![id]
    );
    order_service::outbox::retry_failed_jobs(
        &mut conn,
        &order_service::outbox::RetrySelection::Ids(vec![id]),
    )
    .expect("retry");
    let third = claim(&mut conn, "w", 1, Duration::from_secs(60)).remove(0);
    assert_eq!(third.attempt, 1);
    for stale in [first.lease_token, second.lease_token] {
        assert_eq!(
            finish_jobs(&mut conn, &[done(stale)]).expect("finish").lost,
            vec![id]
        );
    }
    assert!(first.lease_token < second.lease_token && second.lease_token < third.lease_token);
    assert_eq!(
        finish_jobs(&mut conn, &[done(third.lease_token)])
            .expect("finish")
            .applied,
        vec![id]
    );
}

/// A row someone else holds locked (an operator's open transaction) neither
/// blocks the heartbeat and the outcomes of the other jobs nor is taken for lost.
#[test]
fn a_row_locked_elsewhere_is_skipped_and_reported_busy_not_lost() {
    let db = TestDb::new();
    let mut conn = db.conn();
    noops(&mut conn, 2);
    let claimed = claim(&mut conn, "w", 2, Duration::from_secs(60));
    let (held, free) = (&claimed[0], &claimed[1]);

    let mut operator = db.conn();
    diesel::connection::SimpleConnection::batch_execute(&mut operator, "BEGIN")
        .expect("the operator's transaction");
    diesel::sql_query("SELECT id FROM jobs WHERE id = $1 FOR UPDATE")
        .bind::<diesel::sql_types::BigInt, _>(held.id)
        .execute(&mut operator)
        .expect("lock the row");

    let leases: Vec<JobLease> = claimed
        .iter()
        .map(|j| JobLease {
            job_id: j.id,
            lease_token: j.lease_token,
        })
        .collect();
    let started = std::time::Instant::now();
    let beat = extend_leases(&mut conn, &leases, Duration::from_secs(120)).expect("heartbeat");
    assert_eq!(beat.extended, vec![leases[1]]);
    assert_eq!(beat.busy, vec![leases[0]]);
    assert!(beat.lost.is_empty());

    let finishes: Vec<Finish> = claimed
        .iter()
        .map(|j| Finish {
            job_id: j.id,
            lease_token: j.lease_token,
            outcome: Outcome::Done { local: None },
        })
        .collect();
    let report = finish_jobs(&mut conn, &finishes).expect("finish");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "nothing waited on the lock"
    );
    assert_eq!(report.applied, vec![free.id]);
    assert_eq!(report.busy, vec![held.id]);
    assert!(report.lost.is_empty());

    diesel::connection::SimpleConnection::batch_execute(&mut operator, "ROLLBACK")
        .expect("end the operator's transaction");
    let report = finish_jobs(&mut conn, &finishes[..1]).expect("finish");
    assert_eq!(
        report.applied,
        vec![held.id],
        "written once the lock is gone"
    );
}

/// A mail server's reply or a receiver's body can hold anything; the outcome
/// is stored all the same, readable and bounded.
#[test]
fn an_error_with_nul_bytes_control_characters_and_100_kb_is_stored_cleaned() {
    let db = TestDb::new();
    let mut conn = db.conn();
    noops(&mut conn, 1);
    let job = claim(&mut conn, "w", 1, Duration::from_secs(60)).remove(0);
    let hostile = format!(
        "451 4.3.0 temporary\0failure \u{1b}[2J{}",
        "x".repeat(100_000)
    );

    let report = finish_jobs(
        &mut conn,
        &[Finish {
            job_id: job.id,
            lease_token: job.lease_token,
            outcome: Outcome::Retry {
                delay: Duration::ZERO,
                error: hostile,
            },
        }],
    )
    .expect("the write succeeds");
    assert_eq!(report.applied, vec![job.id]);

    let stored: Option<String> = jobs_all::table
        .find(job.id)
        .select(jobs_all::last_error)
        .first(&mut conn)
        .expect("job");
    let stored = stored.expect("an error");
    assert!(
        stored.starts_with("451 4.3.0 temporary\\0failure \\u{1b}[2J"),
        "{}",
        &stored[..60]
    );
    assert!(stored.len() <= order_service::outbox_core::statements::MAX_ERROR_BYTES);
    assert!(stored.ends_with("more bytes]"));
}

/// A lease that lapsed a moment ago most likely belongs to a relay that is
/// back from a blip and about to renew it: the reaper leaves it a margin.
#[test]
fn the_reaper_takes_only_leases_expired_by_more_than_its_margin() {
    let db = TestDb::new();
    let mut conn = db.conn();
    noops(&mut conn, 1);
    claim(&mut conn, "blip", 1, Duration::from_secs(60));
    diesel::sql_query("UPDATE jobs SET lease_expires_at = now() - interval '2 seconds'")
        .execute(&mut conn)
        .expect("lapse the lease");
    let with_margin = |margin: Duration| ReapRequest {
        limit: 10,
        margin,
        spare: &[],
    };

    let report = reap_expired_leases(&mut conn, &with_margin(Duration::from_secs(5)), |_| {
        Duration::ZERO
    })
    .expect("reap");
    assert_eq!(report.total(), 0, "expired 2s ago, inside a 5s margin");
    let report = reap_expired_leases(&mut conn, &with_margin(Duration::from_secs(1)), |_| {
        Duration::from_secs(3)
    })
    .expect("reap");
    assert_eq!(report.requeued, 1);
    assert_eq!(report.next_due, Some(Duration::from_secs(3)));
}

/// While a REPEATABLE READ transaction holds an old snapshot, nothing can
/// remove the index entries of the jobs finished since: a claim from the front
/// walks all of them. A claim from where the last one ended starts past them
/// and reads about what it reads with no pin at all.
#[test]
fn under_a_pinned_horizon_a_claim_from_the_cursor_skips_the_dead_prefix() {
    use diesel::connection::SimpleConnection as _;
    let db = TestDb::new();
    let mut conn = db.conn();
    diesel::sql_query(
        "INSERT INTO jobs (kind, payload) SELECT 'noop', '{}'::jsonb FROM generate_series(1, 21000)",
    )
    .execute(&mut conn)
    .expect("jobs");
    diesel::sql_query("ANALYZE jobs")
        .execute(&mut conn)
        .expect("analyze");
    let unpinned = claim_buffers(&mut conn, None);

    let mut pin = db.conn();
    pin.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM orders;")
        .expect("pin the horizon");

    let kinds = vec!["noop".to_owned()];
    let request = ClaimRequest {
        worker_id: "w",
        kinds: &kinds,
        limit: 1_000,
        lease: Duration::from_secs(60),
    };
    let mut cursor = None;
    let mut finished = 0;
    while finished < 20_000 {
        let jobs = match cursor {
            Some(after) => {
                order_service::outbox_core::statements::claim_jobs_after(&mut conn, &request, after)
            }
            None => claim_jobs(&mut conn, &request),
        }
        .expect("claim");
        assert_eq!(jobs.len(), 1_000, "a full batch past the cursor");
        cursor = jobs.iter().map(|j| j.position()).max();
        let done: Vec<Finish> = jobs
            .iter()
            .map(|j| Finish {
                job_id: j.id,
                lease_token: j.lease_token,
                outcome: Outcome::Done { local: None },
            })
            .collect();
        assert_eq!(
            finish_jobs(&mut conn, &done).expect("finish").applied.len(),
            1_000
        );
        finished += 1_000;
    }
    let from_front = claim_buffers(&mut conn, None);
    let from_cursor = claim_buffers(&mut conn, cursor);
    println!(
        "claim buffers: unpinned {unpinned}, pinned from the front {from_front}, pinned from the cursor {from_cursor}"
    );
    assert!(
        from_front > 3 * unpinned.max(1),
        "the pin should make a claim from the front walk the dead prefix: {from_front} vs {unpinned}"
    );
    assert!(
        from_cursor <= 2 * unpinned.max(20),
        "a claim from the cursor should read about what an unpinned claim reads: {from_cursor} vs {unpinned}"
    );
    // Both still claim the right jobs: the oldest 16 left.
    let next = order_service::outbox_core::statements::claim_jobs_after(
        &mut conn,
        &ClaimRequest {
            limit: 16,
            ..request.clone()
        },
        cursor.expect("cursor"),
    )
    .expect("claim after");
    let ids: Vec<i64> = next.iter().map(|j| j.id).collect();
    let expected: Vec<i64> = jobs_all::table
        .filter(jobs_all::status.eq("processing"))
        .select(jobs_all::id)
        .order(jobs_all::id)
        .load(&mut conn)
        .expect("claimed");
    assert_eq!(ids, expected);
    pin.batch_execute("COMMIT").expect("unpin");
}
