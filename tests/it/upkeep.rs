//! The relay's upkeep: old attempt and audit rows go, expired previous
//! secrets are cleared, without an operator running anything.

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Text};

use crate::endpoint_delivery::{add_endpoint, place};
use crate::support::http::{Answer, HttpSink};
use crate::support::process::{BinProcess, Launch};
use crate::support::{TestDb, wait_until};

#[derive(QueryableByName, Debug, PartialEq)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

fn count(conn: &mut PgConnection, sql: &str) -> i64 {
    diesel::sql_query(sql)
        .get_result::<Count>(conn)
        .expect(sql)
        .n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_deletes_old_attempts_and_audit_rows_and_clears_expired_previous_secrets() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = HttpSink::start([], Answer::status(204)).await;
    let (old, _) = add_endpoint(&mut conn, "rotated", &sink, None, 4);
    let (current, _) = add_endpoint(&mut conn, "rotating", &sink, None, 4);
    place(&mut conn);
    let job: i64 = diesel::sql_query("SELECT min(id) AS n FROM jobs")
        .get_result::<Count>(&mut conn)
        .expect("a job")
        .n;
    for (endpoint, expires) in [
        (old, "now() - interval '1 hour'"),
        (current, "now() + interval '1 day'"),
    ] {
        diesel::sql_query(format!(
            "UPDATE endpoints SET previous_secret = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', \
             previous_secret_expires_at = {expires} WHERE id = $1"
        ))
        .bind::<BigInt, _>(endpoint)
        .execute(&mut conn)
        .expect("a previous secret");
    }
    for age in ["40 days", "1 day"] {
        diesel::sql_query(format!(
            "INSERT INTO delivery_attempts \
               (job_id, endpoint_id, attempt, started_at, duration_ms, status_code, outcome, excerpt) \
             VALUES ($1, $2, 1, now() - interval '{age}', 5, 204, 'ok', NULL)"
        ))
        .bind::<BigInt, _>(job)
        .bind::<BigInt, _>(old)
        .execute(&mut conn)
        .expect("an attempt");
    }
    for age in ["500 days", "10 days"] {
        diesel::sql_query(format!(
            "INSERT INTO admin_audit (at, actor, action, target, affected) \
             VALUES (now() - interval '{age}', 'operator#1', 'retry', '[]', 0)"
        ))
        .execute(&mut conn)
        .expect("an audit row");
    }

    // Default retention (30d, 400d); the upkeep runs at the relay's start.
    let launch = Launch::relay("upkeep", &db.url).env("RELAY_KINDS", "noop");
    let (mut relay, _) = BinProcess::start_relay(launch).await;
    wait_until("the upkeep ran", Duration::from_secs(30), || {
        count(&mut conn, "SELECT count(*) AS n FROM admin_audit") == 1
    })
    .await;
    relay.terminate().await;

    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM delivery_attempts WHERE started_at > now() - interval '2 days'"
        ),
        1,
        "the recent attempt is kept"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM delivery_attempts"),
        1
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM admin_audit WHERE at > now() - interval '20 days'"
        ),
        1,
        "the recent audit row is kept"
    );
    #[derive(QueryableByName)]
    struct Previous {
        #[diesel(sql_type = BigInt)]
        id: i64,
        #[diesel(sql_type = Nullable<Text>)]
        previous_secret: Option<String>,
    }
    let previous: Vec<(i64, bool)> =
        diesel::sql_query("SELECT id, previous_secret FROM endpoints ORDER BY id")
            .load::<Previous>(&mut conn)
            .expect("endpoints")
            .into_iter()
            .map(|p| (p.id, p.previous_secret.is_some()))
            .collect();
    assert_eq!(previous, [(old, false), (current, true)]);
}
