//! A claim connection's plan: one generic plan where the pool's kinds are
//! most of `jobs` by the planner's statistics, PostgreSQL's own choice where
//! they are rare or nothing has been analyzed (`outbox/claim_plan.rs`).

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use outbox_core::statements::{ClaimPlan, ClaimRequest, HotStatements, choose_claim_plan};

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
    choose_claim_plan(client, &kinds).await.expect("choose")
}

#[tokio::test]
async fn a_pool_of_the_common_kinds_keeps_a_generic_plan_and_one_of_a_rare_kind_or_before_any_analyze_does_not()
 {
    let db = TestDb::new();
    let mut conn = db.conn();
    enqueue(&mut conn, "common", 2_000);
    enqueue(&mut conn, "rare", 20);
    let client = connect(&db).await;

    // Never analyzed: no statistics to go by.
    assert_eq!(
        choose(&client, &["common", "rare"]).await,
        ClaimPlan::Chosen
    );
    assert_eq!(plan_cache_mode(&client).await, "auto");

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
