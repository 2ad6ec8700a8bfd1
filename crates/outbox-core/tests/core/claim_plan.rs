//! A claim connection's plan: one generic plan where the pool's kinds are
//! most of `jobs` by the planner's statistics, PostgreSQL's own choice where
//! they are rare or nothing has been analyzed (`outbox/claim_plan.rs`).

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use outbox_core::statements::{
    BY_KEY_PLANNING, CLAIM_PARAMS, CLAIM_SQL, ClaimPlan, ClaimPlanner, ClaimRequest,
    HOT_STATEMENT_FILES, HotStatements,
};

use crate::support::{TestDb, connect};

fn enqueue(conn: &mut PgConnection, kind: &str, n: i64) {
    diesel::sql_query("INSERT INTO jobs (kind) SELECT $1 FROM generate_series(1, $2)")
        .bind::<Text, _>(kind)
        .bind::<BigInt, _>(n)
        .execute(conn)
        .expect("enqueue");
}

async fn plan_cache_mode(client: &tokio_postgres::Client) -> String {
    client
        .query_one("SHOW plan_cache_mode", &[])
        .await
        .expect("show")
        .get(0)
}

async fn choose(client: &tokio_postgres::Client, kinds: &[&str]) -> ClaimPlan {
    let kinds: Vec<String> = kinds.iter().map(|k| (*k).to_owned()).collect();
    ClaimPlanner::prepare(client)
        .await
        .expect("prepare")
        .choose(client, &kinds)
        .await
        .expect("choose")
}

#[tokio::test]
async fn a_pool_of_the_common_kinds_or_one_before_any_analyze_keeps_a_generic_plan_and_one_of_a_rare_kind_does_not()
 {
    let db = TestDb::new();
    let mut conn = db.conn();
    enqueue(&mut conn, "common", 2_000);
    enqueue(&mut conn, "rare", 20);
    let client = connect(&db).await;

    // Never analyzed: no statistics to go by, and a relay starting on a new
    // table is the common case, which the pinned generic plan serves.
    assert_eq!(choose(&client, &["rare"]).await, ClaimPlan::Generic);
    assert_eq!(plan_cache_mode(&client).await, "force_generic_plan");

    diesel::sql_query("ANALYZE jobs")
        .execute(&mut conn)
        .expect("analyze");
    assert_eq!(choose(&client, &["common"]).await, ClaimPlan::Generic);
    assert_eq!(plan_cache_mode(&client).await, "force_generic_plan");
    // Back to PostgreSQL's choice on the same connection.
    assert_eq!(choose(&client, &["rare"]).await, ClaimPlan::Chosen);
    assert_eq!(plan_cache_mode(&client).await, "auto");
    assert_eq!(
        choose(&client, &["rare", "common"]).await,
        ClaimPlan::Generic
    );
    assert_eq!(choose(&client, &["unknown"]).await, ClaimPlan::Chosen);
}

/// The generic plan claims what the custom plans claim: only the pool's
/// kinds, in claim order, however many the batch asks for.
#[tokio::test]
async fn under_the_generic_plan_a_claim_takes_only_its_kinds_in_order() {
    let db = TestDb::new();
    let mut conn = db.conn();
    enqueue(&mut conn, "common", 300);
    enqueue(&mut conn, "rare", 5);
    enqueue(&mut conn, "common", 300);
    diesel::sql_query("ANALYZE jobs")
        .execute(&mut conn)
        .expect("analyze");
    let client = connect(&db).await;
    let statements = HotStatements::prepare(&client).await.expect("prepare");
    assert_eq!(choose(&client, &["common"]).await, ClaimPlan::Generic);

    let kinds = vec!["common".to_owned()];
    let mut claimed: Vec<i64> = Vec::new();
    // More claims than the five custom plans PostgreSQL makes first.
    for limit in [7, 64, 1, 128, 3, 200, 97, 500] {
        let request = ClaimRequest {
            worker_id: "generic",
            kinds: &kinds,
            limit,
            lease: Duration::from_secs(60),
        };
        let jobs = statements
            .claim(&client, &request, None)
            .await
            .expect("claim");
        let expected = usize::try_from(limit)
            .expect("limit")
            .min(600 - claimed.len());
        assert_eq!(jobs.len(), expected, "a claim of {limit}");
        assert!(jobs.iter().all(|j| j.kind == "common"));
        // Each claim takes the jobs after the last one's, oldest first.
        let last = claimed.iter().max().copied().unwrap_or(0);
        assert!(
            jobs.iter().all(|j| j.id > last),
            "a claim of {limit} went back"
        );
        claimed.extend(jobs.iter().map(|j| j.id));
    }
    let mut sorted = claimed.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), 600, "every common job once");
    // The rare kind's jobs are left pending.
    let left: i64 = client
        .query_one(
            "SELECT count(*) FROM jobs WHERE kind = 'rare' AND status = 'pending'",
            &[],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(left, 5);
}

/// Prepares `sql` as `name` with parameters of `types`, and runs it once
/// with `args`: its plan is made now.
async fn prepare_and_run(
    client: &tokio_postgres::Client,
    name: &str,
    types: &str,
    sql: &str,
    args: &str,
) {
    client
        .batch_execute(&format!("PREPARE {name}({types}) AS {sql}"))
        .await
        .expect("prepare");
    client
        .batch_execute(&format!("EXECUTE {name}({args})"))
        .await
        .expect("execute");
}

/// `EXPLAIN EXECUTE` of the prepared statement `name` with `args`, one line
/// a row.
async fn explain(client: &tokio_postgres::Client, name: &str, args: &str) -> String {
    client
        .query(&format!("EXPLAIN EXECUTE {name}({args})"), &[])
        .await
        .expect("explain")
        .iter()
        .map(|row| row.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A plan made while `jobs` is empty and kept while it grows reads it by
/// its indexes: the claim's pinned generic plan walks the claim index in
/// order and probes the primary key, and the finish, planned as the pool's
/// other connections plan it, reads no table in full. Made from an empty
/// table's statistics, both read `jobs` by sequential scans before.
#[tokio::test]
async fn plans_made_on_an_empty_table_read_it_by_its_indexes_once_it_has_grown() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let claims = connect(&db).await;
    assert_eq!(choose(&claims, &["common"]).await, ClaimPlan::Generic);
    let types: Vec<&str> = CLAIM_PARAMS.iter().map(|t| t.name()).collect();
    let claim_args = "16, ARRAY['common'], 'w', 60000, NULL, 0";
    prepare_and_run(&claims, "claim", &types.join(", "), CLAIM_SQL, claim_args).await;

    let writes = connect(&db).await;
    writes
        .batch_execute(BY_KEY_PLANNING)
        .await
        .expect("plan by key");
    let finish = HOT_STATEMENT_FILES
        .iter()
        .find(|(file, _)| *file == "finish_jobs.sql")
        .map(|(_, text)| *text)
        .expect("the finish");
    let finish_args = "ARRAY[1], ARRAY[1], ARRAY['done'], ARRAY[0], ARRAY[NULL], 'c'";
    prepare_and_run(
        &writes,
        "finish",
        "bigint[], bigint[], text[], bigint[], text[], text",
        finish,
        finish_args,
    )
    .await;

    enqueue(&mut conn, "common", 20_000);
    let claim = explain(&claims, "claim", claim_args).await;
    assert!(
        claim.contains("Index Scan using jobs_claim_idx on jobs"),
        "{claim}"
    );
    for read_in_full in ["Seq Scan on jobs", "Bitmap Heap Scan on jobs", "Sort"] {
        assert!(!claim.contains(read_in_full), "{read_in_full}: {claim}");
    }
    let finish = explain(&writes, "finish", finish_args).await;
    assert!(!finish.contains("Seq Scan"), "{finish}");
}
