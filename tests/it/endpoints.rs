//! `outbox-relay endpoints ...` as an operator runs it: the built binary
//! against a real database. Bad input names its flag and writes nothing.

use std::process::{Command, Output};

use base64::Engine as _;
use diesel::prelude::*;
use order_service::schema::{endpoints, jobs};
use serde_json::Value;

use crate::support::TestDb;

fn endpoints_cmd(db: &TestDb, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .arg("endpoints")
        .args(args)
        .env("DATABASE_URL", &db.url)
        .output()
        .expect("run outbox-relay")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[track_caller]
fn assert_exit(output: &Output, code: i32) {
    assert_eq!(
        output.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        stdout(output),
        stderr(output)
    );
}

#[derive(Clone, Copy)]
enum Stream {
    Stdout,
    Stderr,
}

/// The command exited with `code` and said `text` on `stream`.
#[track_caller]
fn assert_says(output: &Output, code: i32, stream: Stream, text: &str) {
    assert_exit(output, code);
    let said = match stream {
        Stream::Stdout => stdout(output),
        Stream::Stderr => stderr(output),
    };
    assert!(said.contains(text), "expected {text:?} in: {said}");
}

fn endpoint_count(conn: &mut PgConnection) -> i64 {
    endpoints::table.count().get_result(conn).expect("count")
}

fn secret_of(conn: &mut PgConnection, name: &str) -> (String, Option<String>) {
    endpoints::table
        .filter(endpoints::name.eq(name))
        .select((endpoints::secret, endpoints::previous_secret))
        .first(conn)
        .expect("endpoint")
}

#[test]
fn an_added_endpoint_gets_a_new_whsec_secret_printed_once_and_is_listed() {
    let db = TestDb::new();
    let mut conn = db.conn();

    let added = endpoints_cmd(
        &db,
        &[
            "add",
            "--name",
            "fulfilment",
            "--url",
            "https://ship.example.com/in",
            "--events",
            "order.paid,order.cancelled",
            "--rate-limit",
            "5/s",
            "--max-in-flight",
            "4",
            "--json",
        ],
    );
    assert_exit(&added, 0);
    let json: Value = serde_json::from_str(&stdout(&added)).expect("JSON");
    assert_eq!(json["name"], "fulfilment");
    let secret = json["secret"].as_str().expect("secret");
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.strip_prefix("whsec_").expect("whsec_"))
        .expect("base64");
    assert_eq!(key.len(), 32);
    assert_eq!(secret_of(&mut conn, "fulfilment").0, secret);

    let listed = endpoints_cmd(&db, &["list", "--json"]);
    assert_exit(&listed, 0);
    let list: Value = serde_json::from_str(&stdout(&listed)).expect("JSON");
    let row = &list[0];
    assert_eq!(row["name"], "fulfilment");
    assert_eq!(row["url"], "https://ship.example.com/in");
    assert_eq!(
        row["event_types"],
        serde_json::json!(["order.paid", "order.cancelled"])
    );
    assert_eq!(row["rate_limit"], 5.0);
    assert_eq!(row["max_in_flight"], 4);
    assert_eq!(row["enabled"], true);
    assert!(
        !stdout(&listed).contains(secret),
        "the list never shows a secret"
    );
    let table = endpoints_cmd(&db, &["list"]);
    assert_exit(&table, 0);
    assert!(stdout(&table).contains("fulfilment"), "{}", stdout(&table));
    assert!(stdout(&table).contains("5/s"), "{}", stdout(&table));
}

#[test]
fn add_refuses_each_bad_value_naming_its_flag_and_writes_nothing() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let ok = ["--name", "erp", "--url", "https://erp.example.com/hooks"];
    let short_secret = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode([1u8; 16])
    );
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--url", "not a url"],
            "--url: \"not a url\" is not a URL",
        ),
        (
            vec!["--url", "ftp://erp.example.com/"],
            "--url: scheme \"ftp\"",
        ),
        (
            vec!["--url", "https://user:pw@erp.example.com/"],
            "--url: the URL carries credentials",
        ),
        (vec!["--url", "http://erp.example.com/"], "--allow-http"),
        (
            vec!["--events", "order.returned"],
            "--events: unknown event type \"order.returned\"",
        ),
        (vec!["--rate-limit", "0/s"], "--rate-limit: \"0/s\""),
        (vec!["--rate-limit", "ten"], "--rate-limit: \"ten\""),
        (vec!["--max-in-flight", "0"], "--max-in-flight"),
        (
            vec!["--secret", "hunter2"],
            "--secret: is not a Standard Webhooks secret",
        ),
        (
            vec!["--secret", "whsec_***"],
            "--secret: the part after whsec_ is not base64",
        ),
        (
            vec!["--secret", short_secret.as_str()],
            "--secret: the key is 16 bytes",
        ),
        (
            vec!["--name", "no spaces"],
            "--name: \"no spaces\" is not a valid name",
        ),
    ];
    for (overrides, said) in cases {
        let mut args = vec!["add"];
        // A later flag wins in clap only for repeated options it allows, so
        // build each command with the bad value in place of the good one.
        let mut i = 0;
        while i < ok.len() {
            let flag = ok[i];
            match overrides.iter().position(|o| *o == flag) {
                Some(at) => args.extend([flag, overrides[at + 1]]),
                None => args.extend([flag, ok[i + 1]]),
            }
            i += 2;
        }
        for pair in overrides.chunks(2) {
            if !ok.contains(&pair[0]) {
                args.extend(pair);
            }
        }
        let output = endpoints_cmd(&db, &args);
        assert_exit(&output, 2);
        assert!(
            stderr(&output).contains(said),
            "{args:?}: expected {said:?} in {}",
            stderr(&output)
        );
        assert!(!stderr(&output).contains("hunter2"), "{}", stderr(&output));
        assert_eq!(endpoint_count(&mut conn), 0, "{args:?} wrote an endpoint");
    }

    assert_exit(&endpoints_cmd(&db, &["add", ok[0], ok[1], ok[2], ok[3]]), 0);
    let again = endpoints_cmd(
        &db,
        &["add", ok[0], ok[1], ok[2], "https://other.example.com/"],
    );
    assert_says(
        &again,
        1,
        Stream::Stderr,
        "an endpoint named \"erp\" already exists",
    );
    assert_eq!(endpoint_count(&mut conn), 1);
    let http = endpoints_cmd(
        &db,
        &[
            "add",
            "--name",
            "lab",
            "--url",
            "http://lab.example.com/",
            "--allow-http",
        ],
    );
    assert_exit(&http, 0);
}

#[test]
fn disable_and_enable_change_the_state_and_an_unknown_name_is_refused() {
    let db = TestDb::new();
    assert_exit(
        &endpoints_cmd(
            &db,
            &["add", "--name", "erp", "--url", "https://erp.example.com/"],
        ),
        0,
    );
    let disabled = endpoints_cmd(&db, &["disable", "erp"]);
    assert_says(&disabled, 0, Stream::Stdout, "erp is disabled (operator)");
    let enabled = endpoints_cmd(&db, &["enable", "erp"]);
    assert_says(&enabled, 0, Stream::Stdout, "erp is enabled");
    let unknown = endpoints_cmd(&db, &["disable", "nope"]);
    assert_says(&unknown, 1, Stream::Stderr, "no endpoint is named \"nope\"");
}

#[test]
fn a_rotated_secret_keeps_the_old_one_signing_for_the_grace_period_only() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let added = endpoints_cmd(
        &db,
        &[
            "add",
            "--name",
            "erp",
            "--url",
            "https://erp.example.com/",
            "--json",
        ],
    );
    assert_exit(&added, 0);
    let first: Value = serde_json::from_str(&stdout(&added)).expect("JSON");
    let first = first["secret"].as_str().expect("secret").to_owned();

    let rotated = endpoints_cmd(&db, &["rotate-secret", "erp", "--keep-old", "1h", "--json"]);
    assert_exit(&rotated, 0);
    let second: Value = serde_json::from_str(&stdout(&rotated)).expect("JSON");
    let second = second["secret"].as_str().expect("secret").to_owned();
    assert_ne!(first, second);
    assert_eq!(secret_of(&mut conn, "erp"), (second.clone(), Some(first)));
    let grace: f64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::Double>(
        "(SELECT extract(epoch FROM previous_secret_expires_at - now())::float8 \
         FROM endpoints WHERE name = 'erp')",
    ))
    .get_result(&mut conn)
    .expect("grace");
    assert!((3500.0..=3600.0).contains(&grace), "{grace}");

    let dropped = endpoints_cmd(&db, &["rotate-secret", "erp", "--keep-old", "0s"]);
    assert_says(&dropped, 0, Stream::Stdout, "the old one no longer signs");
    let (third, previous) = secret_of(&mut conn, "erp");
    assert_ne!(third, second);
    assert_eq!(previous, None);
}

#[test]
fn removing_an_endpoint_with_queued_deliveries_asks_for_force_and_says_how_many() {
    let db = TestDb::new();
    let mut conn = db.conn();
    assert_exit(
        &endpoints_cmd(
            &db,
            &["add", "--name", "erp", "--url", "https://erp.example.com/"],
        ),
        0,
    );
    let endpoint_id: i64 = endpoints::table
        .filter(endpoints::name.eq("erp"))
        .select(endpoints::id)
        .first(&mut conn)
        .expect("id");
    // Written as rows, as the fan-out will write them: a delivery names its
    // endpoint by id in its payload.
    let enqueue = |conn: &mut PgConnection, endpoint: i64| -> i64 {
        #[derive(QueryableByName)]
        struct Id {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            id: i64,
        }
        diesel::sql_query(
            "INSERT INTO jobs (kind, payload) \
             VALUES ('order_webhook', jsonb_build_object('endpoint_id', $1::bigint)) RETURNING id",
        )
        .bind::<diesel::sql_types::BigInt, _>(endpoint)
        .get_result::<Id>(conn)
        .expect("enqueue")
        .id
    };
    let ours = [
        enqueue(&mut conn, endpoint_id),
        enqueue(&mut conn, endpoint_id),
    ];
    let theirs = enqueue(&mut conn, endpoint_id + 1000);

    let refused = endpoints_cmd(&db, &["remove", "erp"]);
    assert_exit(&refused, 1);
    assert!(
        stderr(&refused).contains("endpoint \"erp\" has 2 unfinished deliveries")
            && stderr(&refused).contains("--force"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(endpoint_count(&mut conn), 1, "nothing removed");

    let forced = endpoints_cmd(&db, &["remove", "erp", "--force"]);
    assert_says(
        &forced,
        0,
        Stream::Stdout,
        "cancelled its 2 unfinished deliveries",
    );
    assert_eq!(endpoint_count(&mut conn), 0);
    let status = |conn: &mut PgConnection, id: i64| -> String {
        jobs::table
            .find(id)
            .select(jobs::status)
            .first(conn)
            .expect("job")
    };
    for id in ours {
        assert_eq!(status(&mut conn, id), "cancelled");
    }
    assert_eq!(
        status(&mut conn, theirs),
        "pending",
        "another endpoint's delivery stays"
    );
}
