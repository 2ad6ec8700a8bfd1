//! `outbox-relay jobs ...` as an operator runs it: the built binary against a
//! real database.

use crate::support::enqueue;
use order_service::orders::order_enqueuer;
use std::process::{Command, Output};

use diesel::prelude::*;
use order_service::orders::place_order;
use order_service::schema::{jobs, jobs_all};
use serde_json::Value;

use crate::support::{TestDb, make_done, sample_order, status_counts};

fn outbox_relay(database_url: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox-relay"));
    cmd.args(args).env_remove("DATABASE_URL");
    if let Some(url) = database_url {
        cmd.env("DATABASE_URL", url);
    }
    cmd.output().expect("run outbox-relay")
}

fn jobs_cmd(db: &TestDb, args: &[&str]) -> Output {
    let mut all = vec!["jobs"];
    all.extend_from_slice(args);
    outbox_relay(Some(&db.url), &all)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn assert_ok(output: &Output) {
    assert_eq!(
        output.status.code(),
        Some(0),
        "stdout: {}\nstderr: {}",
        stdout(output),
        stderr(output)
    );
}

/// Places `n` orders (three jobs each) and returns the job ids by order.
fn seed_orders(conn: &mut PgConnection, n: usize) -> Vec<(i64, Vec<i64>)> {
    (0..n)
        .map(|_| {
            let order_id = place_order(conn, &order_enqueuer(), &sample_order(), None, 8)
                .expect("place order")
                .order_id();
            let ids = jobs::table
                .filter(jobs::order_id.eq(order_id))
                .order(jobs::id)
                .select(jobs::id)
                .load(conn)
                .expect("jobs");
            (order_id, ids)
        })
        .collect()
}

fn set_failed(conn: &mut PgConnection, id: i64, error: &str) {
    diesel::update(jobs::table.find(id))
        .set((
            jobs::status.eq("failed"),
            jobs::attempts.eq(8),
            jobs::last_error.eq(error),
            jobs::finished_at.eq(diesel::dsl::now),
        ))
        .execute(conn)
        .expect("fail job");
}

fn set_done_days_ago(conn: &mut PgConnection, id: i64, days: i32) {
    let moved = make_done(
        conn,
        &format!("id = {id}"),
        &format!("now() - interval '{days} days'"),
    );
    assert_eq!(moved, 1, "job {id} moved to jobs_done");
}

fn status_of(conn: &mut PgConnection, id: i64) -> (String, i32, Option<String>) {
    jobs_all::table
        .find(id)
        .select((jobs_all::status, jobs_all::attempts, jobs_all::last_error))
        .first(conn)
        .expect("job")
}

/// A table row's cells (the table pads with spaces; no cell here has one).
fn row<'a>(table: &'a str, first: &str) -> Vec<&'a str> {
    table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&first))
        .unwrap_or_else(|| panic!("no row {first} in\n{table}"))
}

#[test]
fn stats_shows_counts_by_kind_and_status_expired_leases_and_the_oldest_due_job() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let orders = seed_orders(&mut conn, 2);
    let [email, receipt, webhook] = orders[0].1[..] else {
        panic!("three jobs")
    };
    set_failed(&mut conn, email, "boom");
    set_done_days_ago(&mut conn, receipt, 0);
    diesel::sql_query(format!(
        "UPDATE jobs SET status = 'processing', attempts = 1, locked_by = 'gone', \
         lease_token = nextval('jobs_lease_token_seq'), \
         locked_at = now() - interval '2 minutes', \
         lease_expires_at = now() - interval '1 minute' WHERE id = {webhook}"
    ))
    .execute(&mut conn)
    .expect("expire a lease");
    diesel::sql_query(
        "UPDATE jobs SET run_after = now() - interval '90 seconds' WHERE status = 'pending'",
    )
    .execute(&mut conn)
    .expect("age pending jobs");

    let out = jobs_cmd(&db, &["stats"]);

    assert_ok(&out);
    let table = stdout(&out);
    assert!(table.starts_with("KIND"), "{table}");
    assert!(
        table.contains("EXPIRED LEASES") && table.contains("OLDEST DUE PENDING"),
        "{table}"
    );
    // KIND PENDING PROCESSING DONE FAILED EXPIRED OLDEST
    assert_eq!(
        row(&table, "confirmation_email")[..6],
        ["confirmation_email", "1", "0", "0", "1", "0"]
    );
    assert_eq!(
        row(&table, "receipt_pdf")[..6],
        ["receipt_pdf", "1", "0", "1", "0", "0"]
    );
    assert_eq!(
        row(&table, "order_webhook")[..6],
        ["order_webhook", "1", "1", "0", "0", "1"]
    );
    assert_eq!(
        row(&table, "TOTAL")[..6],
        ["TOTAL", "3", "1", "1", "1", "1"]
    );
    let oldest = row(&table, "TOTAL")[6..].join(" ");
    assert!(oldest.starts_with("1m"), "about 90s: {oldest}");

    let out = jobs_cmd(&db, &["stats", "--json"]);
    assert_ok(&out);
    let json: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(json["pending"], 3);
    assert_eq!(json["expired_leases"], 1);
    assert!(
        json["oldest_due_pending_seconds"]
            .as_f64()
            .is_some_and(|s| s >= 89.0)
    );
    assert_eq!(json["kinds"].as_array().map(Vec::len), Some(3));
}

#[test]
fn stats_of_an_empty_queue_says_so() {
    let db = TestDb::new();
    let out = jobs_cmd(&db, &["stats"]);
    assert_ok(&out);
    assert_eq!(stdout(&out).trim(), "no jobs");
}

#[test]
fn list_filters_by_status_kind_and_order_and_prints_json_for_scripts() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let orders = seed_orders(&mut conn, 2);
    let failed = orders[1].1[2];
    let long_error = format!("webhook answered 500\n{}", "x".repeat(200));
    set_failed(&mut conn, failed, &long_error);

    let out = jobs_cmd(&db, &["list", "--status", "failed", "--json"]);
    assert_ok(&out);
    let rows: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    let rows = rows.as_array().expect("array");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["id"], failed);
    assert_eq!(rows[0]["order_id"], orders[1].0);
    assert_eq!(rows[0]["last_error"], long_error.as_str(), "untruncated");

    let out = jobs_cmd(&db, &["list", "--order", &orders[0].0.to_string()]);
    assert_ok(&out);
    let table = stdout(&out);
    assert!(table.starts_with("ID"), "{table}");
    assert!(table.contains("LAST ERROR"), "{table}");
    assert_eq!(table.lines().count(), 1 + 3, "{table}");

    let out = jobs_cmd(&db, &["list", "--kind", "receipt_pdf", "--json"]);
    assert_ok(&out);
    let rows: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(rows.as_array().map(Vec::len), Some(2));

    let out = jobs_cmd(&db, &["list"]);
    assert_ok(&out);
    let table = stdout(&out);
    let failed_line = table
        .lines()
        .find(|l| l.contains("failed"))
        .expect("failed row");
    assert!(
        failed_line.contains("webhook answered 500 x") && failed_line.ends_with('…'),
        "one line, truncated: {failed_line}"
    );
    assert!(failed_line.contains("8/8"), "{failed_line}");

    let out = jobs_cmd(&db, &["list", "--limit", "2"]);
    assert_ok(&out);
    assert_eq!(stdout(&out).lines().count(), 1 + 2);
    assert!(stderr(&out).contains("--limit"), "{}", stderr(&out));
}

#[test]
fn retry_puts_named_failed_jobs_back_to_pending_with_attempts_reset() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let orders = seed_orders(&mut conn, 1);
    let (a, b) = (orders[0].1[0], orders[0].1[2]);
    set_failed(&mut conn, a, "smtp 451");
    set_failed(&mut conn, b, "webhook 500");

    let out = jobs_cmd(&db, &["retry", &a.to_string(), &b.to_string()]);

    assert_ok(&out);
    assert!(stdout(&out).contains("retried 2 jobs"), "{}", stdout(&out));
    assert_eq!(
        status_of(&mut conn, a),
        ("pending".into(), 0, Some("smtp 451".into())),
        "last_error is kept until the next attempt"
    );
    assert_eq!(status_of(&mut conn, b).0, "pending");
}

#[test]
fn retry_refuses_jobs_that_are_not_failed_and_changes_nothing() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let orders = seed_orders(&mut conn, 1);
    let [failed, done, _pending] = orders[0].1[..] else {
        panic!("three jobs")
    };
    set_failed(&mut conn, failed, "boom");
    set_done_days_ago(&mut conn, done, 0);

    let out = jobs_cmd(&db, &["retry", &failed.to_string(), &done.to_string()]);

    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("job {done} is done, not failed")),
        "{err}"
    );
    assert!(err.contains("nothing was changed"), "{err}");
    assert_eq!(status_of(&mut conn, failed).0, "failed", "all or nothing");

    let out = jobs_cmd(&db, &["retry", "424242"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("job 424242 does not exist"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn cancel_gives_up_on_pending_and_failed_jobs_and_refuses_the_rest() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let orders = seed_orders(&mut conn, 2);
    let [pending, failed, done] = orders[0].1[..] else {
        panic!("three jobs")
    };
    set_failed(&mut conn, failed, "smtp 550");
    set_done_days_ago(&mut conn, done, 0);
    let processing = orders[1].1[0];
    diesel::sql_query(format!(
        "UPDATE jobs SET status = 'processing', attempts = 1, locked_by = 'relay-a', \
         locked_at = now(), lease_expires_at = now() + interval '1 minute', \
         lease_token = nextval('jobs_lease_token_seq') WHERE id = {processing}"
    ))
    .execute(&mut conn)
    .expect("claim a job");

    // A finished or running job refuses the whole command.
    for refused in [done, processing] {
        let out = jobs_cmd(&db, &["cancel", &pending.to_string(), &refused.to_string()]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!("job {refused} is")),
            "{}",
            stderr(&out)
        );
        assert!(
            stderr(&out).contains("nothing was changed"),
            "{}",
            stderr(&out)
        );
        assert_eq!(status_of(&mut conn, pending).0, "pending", "all or nothing");
    }
    let out = jobs_cmd(&db, &["cancel", "424242"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("job 424242 does not exist"),
        "{}",
        stderr(&out)
    );

    let out = jobs_cmd(&db, &["cancel", &pending.to_string(), &failed.to_string()]);

    assert_ok(&out);
    assert!(
        stdout(&out).contains("cancelled 2 jobs"),
        "{}",
        stdout(&out)
    );
    assert_eq!(status_of(&mut conn, pending).0, "cancelled");
    assert_eq!(
        status_of(&mut conn, failed),
        ("cancelled".into(), 8, Some("smtp 550".into())),
        "the last error stays as the record of why"
    );
    let finished: Option<chrono::DateTime<chrono::Utc>> = jobs::table
        .find(pending)
        .select(jobs::finished_at)
        .first(&mut conn)
        .expect("job");
    assert!(finished.is_some(), "a cancelled job is finished");
    assert_eq!(status_of(&mut conn, processing).0, "processing");

    let out = jobs_cmd(&db, &["stats", "--json"]);
    assert_ok(&out);
    let json: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(json["cancelled"], 2);
    let out = jobs_cmd(&db, &["list", "--status", "cancelled"]);
    assert_ok(&out);
    assert_eq!(stdout(&out).lines().count(), 3, "{}", stdout(&out));
}

#[test]
fn cancelling_a_failed_head_releases_the_next_job_of_its_key() {
    use order_service::outbox::NewJob;
    let db = TestDb::new();
    let mut conn = db.conn();
    let job = |n: i32| {
        NewJob::new("noop", serde_json::json!({ "n": n }))
            .with_options(&order_service::outbox::JobOptions::default().ordering_key("k-1"))
    };
    let head = enqueue(&mut conn, &job(1)).expect("enqueue");
    let second = enqueue(&mut conn, &job(2)).expect("enqueue");
    let third = enqueue(&mut conn, &job(3)).expect("enqueue");
    set_failed(&mut conn, head, "boom");
    let blocked = |conn: &mut PgConnection, id: i64| -> bool {
        jobs::table
            .find(id)
            .select(jobs::blocked)
            .first(conn)
            .expect("job")
    };
    assert!(blocked(&mut conn, second) && blocked(&mut conn, third));

    // Cancelling a waiting job frees it from the wait but not its successor.
    let out = jobs_cmd(&db, &["cancel", &second.to_string()]);
    assert_ok(&out);
    assert!(
        !blocked(&mut conn, second),
        "a cancelled job waits for nothing"
    );
    assert!(
        blocked(&mut conn, third),
        "the failed head still holds the key"
    );

    let out = jobs_cmd(&db, &["cancel", &head.to_string()]);
    assert_ok(&out);
    assert_eq!(status_of(&mut conn, head).0, "cancelled");
    assert!(
        !blocked(&mut conn, third),
        "the key moved on to the next job"
    );
    assert_eq!(status_of(&mut conn, third).0, "pending");
}

#[test]
fn retry_failed_takes_every_failed_job_or_those_of_one_kind() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let orders = seed_orders(&mut conn, 2);
    for (_, ids) in &orders {
        set_failed(&mut conn, ids[0], "smtp");
        set_failed(&mut conn, ids[2], "webhook");
    }

    let out = jobs_cmd(&db, &["retry", "--failed", "--kind", "order_webhook"]);
    assert_ok(&out);
    assert!(stdout(&out).contains("retried 2 jobs"), "{}", stdout(&out));
    assert_eq!(status_counts(&mut conn).get("failed"), Some(&2));

    let out = jobs_cmd(&db, &["retry", "--failed"]);
    assert_ok(&out);
    assert!(stdout(&out).contains("retried 2 jobs"), "{}", stdout(&out));

    let out = jobs_cmd(&db, &["retry", "--failed"]);
    assert_ok(&out);
    assert!(stdout(&out).contains("no failed jobs"), "{}", stdout(&out));
    assert_eq!(status_counts(&mut conn).get("failed"), None);
}

#[test]
fn prune_dry_run_counts_and_deletes_nothing_then_prune_deletes_only_old_done_jobs() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let orders = seed_orders(&mut conn, 2);
    for id in [orders[0].1[0], orders[0].1[1], orders[0].1[2]] {
        set_done_days_ago(&mut conn, id, 10);
    }
    let recent = orders[1].1[0];
    set_done_days_ago(&mut conn, recent, 1);
    let old_failed = orders[1].1[1];
    set_failed(&mut conn, old_failed, "boom");
    diesel::sql_query(format!(
        "UPDATE jobs SET finished_at = now() - interval '30 days' WHERE id = {old_failed}"
    ))
    .execute(&mut conn)
    .expect("age the failed job");

    let out = jobs_cmd(&db, &["prune", "--older-than", "7d", "--dry-run"]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("would delete 3 done jobs that finished more than 7d ago"),
        "{}",
        stdout(&out)
    );
    assert_eq!(jobs_all::table.count().get_result::<i64>(&mut conn), Ok(6));

    // The effect ledger's answers go with the jobs they describe: one whose
    // job stays, stays, however old it is.
    diesel::sql_query(format!(
        "INSERT INTO effect_results (job_id, message_id, recorded_at) VALUES \
         ({}, '<old@example.com>', now() - interval '10 days'), \
         ({recent}, '<recent@example.com>', now() - interval '10 days')",
        orders[0].1[0]
    ))
    .execute(&mut conn)
    .expect("ledger answers");

    let out = jobs_cmd(&db, &["prune", "--older-than", "7d", "--batch-size", "1"]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("deleted 3 done jobs that finished more than 7d ago, in 3 batches")
            && stdout(&out).contains("deleted 1 effect ledger answer recorded more than 7d ago"),
        "{}",
        stdout(&out)
    );
    let answers: Vec<i64> =
        diesel::dsl::sql::<diesel::sql_types::BigInt>("SELECT job_id FROM effect_results")
            .load(&mut conn)
            .expect("ledger answers");
    assert_eq!(
        answers,
        [recent],
        "the recent job's answer stays with its job"
    );
    assert!(stderr(&out).contains("of ~3"), "progress: {}", stderr(&out));
    let left: Vec<i64> = jobs_all::table
        .select(jobs_all::id)
        .order(jobs_all::id)
        .load(&mut conn)
        .expect("jobs");
    assert_eq!(left, orders[1].1, "recent done and failed jobs stay");

    let out = jobs_cmd(&db, &["prune", "--older-than", "7d"]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("nothing to prune"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn prune_drops_whole_days_of_done_jobs_and_says_so() {
    let db = TestDb::new();
    let mut conn = db.conn();
    diesel::sql_query("SELECT jobs_done_ensure_partitions(now() - interval '10 days', 2)")
        .execute(&mut conn)
        .expect("partitions for the last days");
    let orders = seed_orders(&mut conn, 2);
    for &id in &orders[0].1 {
        set_done_days_ago(&mut conn, id, 10);
    }
    set_done_days_ago(&mut conn, orders[1].1[0], 2);

    let out = jobs_cmd(&db, &["prune", "--older-than", "7d", "--dry-run"]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("would delete 3 done jobs that finished more than 7d ago"),
        "{}",
        stdout(&out)
    );

    let out = jobs_cmd(&db, &["prune", "--older-than", "7d"]);
    assert_ok(&out);
    let said = stdout(&out);
    assert!(
        said.contains("deleted 3 done jobs that finished more than 7d ago, in ")
            && said.contains("dropped daily partitions")
            && !said.contains("batch"),
        "whole days are dropped, no row is deleted: {said}"
    );
    let left: Vec<i64> = jobs_all::table
        .filter(jobs_all::status.eq("done"))
        .select(jobs_all::id)
        .load(&mut conn)
        .expect("jobs");
    assert_eq!(left, [orders[1].1[0]], "the job done 2 days ago stays");
}

#[test]
fn bad_arguments_are_refused_with_exit_2_naming_the_value() {
    let db = TestDb::new();
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["prune", "--older-than", "soon"],
            &["soon", "--older-than"],
        ),
        (&["prune", "--older-than", "0s"], &["0s", "--older-than"]),
        (&["prune"], &["--older-than"]),
        (&["list", "--status", "stuck"], &["stuck", "--status"]),
        (&["list", "--limit", "0"], &["--limit"]),
        (&["list", "--order", "abc"], &["abc", "--order"]),
        (&["retry", "seven"], &["seven"]),
        (&["retry"], &["--failed"]),
        (&["retry", "5", "--failed"], &["--failed"]),
        (&["retry", "--kind", "noop"], &["--failed"]),
        (&["purge"], &["purge"]),
    ];
    for (args, mentions) in cases {
        let out = jobs_cmd(&db, args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        for mention in *mentions {
            assert!(
                err.contains(mention),
                "{args:?} should name {mention}: {err}"
            );
        }
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn a_missing_or_unreachable_database_is_a_clear_error() {
    let out = outbox_relay(None, &["jobs", "stats"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--database-url"), "{}", stderr(&out));

    let out = outbox_relay(
        Some("postgres://postgres@127.0.0.1:1/nowhere"),
        &["jobs", "stats"],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("connecting to postgres://"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn every_command_explains_itself_with_help() {
    let cases: &[(&[&str], &str)] = &[
        (&["jobs", "--help"], "prune"),
        (&["jobs", "stats", "--help"], "expired leases"),
        (&["jobs", "list", "--help"], "--status"),
        (&["jobs", "retry", "--help"], "nothing changes"),
        (&["jobs", "prune", "--help"], "--dry-run"),
        (&["serve", "--help"], "API_ADDR"),
        (&["serve", "--help"], "JOB_MAX_ATTEMPTS"),
    ];
    for (args, mention) in cases {
        let out = outbox_relay(None, args);
        assert_ok(&out);
        let help = stdout(&out);
        assert!(help.contains("Usage:"), "{args:?}: {help}");
        assert!(
            help.contains(mention),
            "{args:?} should mention {mention}: {help}"
        );
    }
}

#[test]
fn list_shows_the_parents_a_job_waits_for() {
    use order_service::effects::jobs::Noop;
    use order_service::outbox::{JobOptions, NewJob};

    let db = TestDb::new();
    let mut conn = db.conn();
    let parent = enqueue(&mut conn, &NewJob::new("noop", serde_json::json!({}))).expect("parent");
    let child = NewJob::for_args(
        &Noop(serde_json::json!({ "child": 1 })),
        &JobOptions::default().depends_on([parent]),
    )
    .expect("child");
    let child = enqueue(&mut conn, &child).expect("child");

    let out = jobs_cmd(&db, &["list"]);
    assert_ok(&out);
    let table = stdout(&out);
    assert!(
        table
            .lines()
            .next()
            .is_some_and(|h| h.contains("WAITS FOR")),
        "{table}"
    );
    let line = table
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{child} ")))
        .expect("the child's row");
    assert!(line.ends_with(&format!("job {parent}")), "{line}");

    let out = jobs_cmd(&db, &["list", "--json"]);
    assert_ok(&out);
    let rows: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    let waiting = |id: i64| {
        rows.as_array()
            .and_then(|rows| rows.iter().find(|r| r["id"] == id))
            .map(|r| r["waiting_on"].clone())
    };
    assert_eq!(waiting(child), Some(serde_json::json!([parent])));
    assert_eq!(
        waiting(parent),
        Some(serde_json::json!([])),
        "empty when none"
    );
}

#[test]
fn blocked_lists_dependents_held_by_a_failed_parent_beside_the_held_keys() {
    use order_service::effects::jobs::Noop;
    use order_service::outbox::{JobOptions, NewJob};

    let db = TestDb::new();
    let mut conn = db.conn();
    let out = jobs_cmd(&db, &["blocked"]);
    assert_ok(&out);
    let empty = stdout(&out);
    assert!(
        empty.contains("no ordering key is blocked")
            && empty.contains("no dependent is held by a failed parent"),
        "{empty}"
    );

    // An order whose webhook head failed holds its key; a `hold` dependent
    // of a failed job is held by it.
    let orders = seed_orders(&mut conn, 1);
    let webhook: i64 = jobs::table
        .filter(jobs::order_id.eq(orders[0].0))
        .filter(jobs::kind.eq("order_webhook"))
        .select(jobs::id)
        .first(&mut conn)
        .expect("the webhook");
    set_failed(&mut conn, webhook, "HTTP 422 from the receiver");
    let parent = enqueue(&mut conn, &NewJob::new("noop", serde_json::json!({}))).expect("parent");
    let held = NewJob::for_args(
        &Noop(serde_json::json!({ "held": 1 })),
        &JobOptions::default().depends_on([parent]),
    )
    .expect("held");
    let held = enqueue(&mut conn, &held).expect("held");
    set_failed(&mut conn, parent, "the parent broke");

    let out = jobs_cmd(&db, &["blocked"]);
    assert_ok(&out);
    let table = stdout(&out);
    assert!(
        table.contains("ORDERING KEY") && table.contains(&webhook.to_string()),
        "the held key is still listed: {table}"
    );
    assert!(
        table.contains("HELD JOB") && table.contains("PARENT STATUS"),
        "{table}"
    );
    let cells = row(&table, &held.to_string());
    assert_eq!(
        cells[..6],
        [
            held.to_string().as_str(),
            "noop",
            "hold",
            parent.to_string().as_str(),
            "noop",
            "failed"
        ],
        "{table}"
    );
    assert!(table.contains("the parent broke"), "{table}");

    let out = jobs_cmd(&db, &["blocked", "--json"]);
    assert_ok(&out);
    let json: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(json["ordering_keys"][0]["job_id"], webhook, "{json}");
    let dependents = json["dependents"].as_array().expect("dependents");
    assert_eq!(dependents.len(), 1, "{json}");
    assert_eq!(dependents[0]["job_id"], held);
    assert_eq!(dependents[0]["parent_id"], parent);
    assert_eq!(dependents[0]["parent_status"], "failed");
    assert_eq!(dependents[0]["dependency_policy"], "hold");
}

#[test]
fn jobs_schedules_lists_each_periodic_job_with_its_last_and_next_run() {
    use order_service::outbox::{PeriodicJob, declare_periodic_jobs, enqueue_due_slot};

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Sweep {}
    impl order_service::worker::JobArgs for Sweep {
        const KIND: &'static str = "sweep";
    }

    let db = TestDb::new();
    let out = jobs_cmd(&db, &["schedules"]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("no periodic jobs"),
        "{}",
        stdout(&out)
    );

    let mut conn = db.conn();
    let hourly = PeriodicJob::every("sweep", std::time::Duration::from_secs(3600), &Sweep {})
        .expect("valid");
    let nightly = PeriodicJob::cron("nightly", "0 3 * * *", &Sweep {}).expect("valid");
    let now = chrono::Utc::now();
    let jobs = [hourly.clone(), nightly];
    declare_periodic_jobs(&mut conn, &jobs, now - chrono::Duration::hours(3)).expect("declare");
    let enqueued = enqueue_due_slot(&mut conn, &order_enqueuer(), &hourly, now)
        .expect("enqueue")
        .expect("a slot due");

    let out = jobs_cmd(&db, &["schedules", "--json"]);
    assert_ok(&out);
    let json: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    let rows = json.as_array().expect("an array");
    assert_eq!(rows.len(), 2, "{json}");
    let (nightly, sweep) = (&rows[0], &rows[1]);
    assert_eq!(nightly["name"], "nightly");
    assert_eq!(nightly["schedule"], "cron 0 3 * * *");
    assert_eq!(nightly["last_run"], Value::Null, "{json}");
    assert!(
        nightly["next_run"]
            .as_str()
            .is_some_and(|t| t.contains("T03:00:00")),
        "{json}"
    );
    assert_eq!(sweep["name"], "sweep");
    assert_eq!(sweep["schedule"], "every 1h");
    assert_eq!(sweep["kind"], "sweep");
    assert_eq!(sweep["last_job_id"], enqueued.job_id);
    let last: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(sweep["last_run"].clone()).expect("a time");
    let next: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(sweep["next_run"].clone()).expect("a time");
    assert_eq!(last, enqueued.slot);
    assert_eq!(next, enqueued.slot + chrono::Duration::hours(1));
    let job_order: Option<i64> = jobs::table
        .find(enqueued.job_id)
        .select(jobs::order_id)
        .first(&mut conn)
        .expect("the job");
    assert_eq!(job_order, None, "a periodic job has no order");

    let out = jobs_cmd(&db, &["schedules"]);
    assert_ok(&out);
    let table = stdout(&out);
    assert!(table.contains("NEXT RUN"), "{table}");
    assert!(
        table.contains("every 1h") && table.contains("nightly"),
        "{table}"
    );
    assert!(table.contains(&enqueued.job_id.to_string()), "{table}");
}
