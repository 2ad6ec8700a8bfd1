//! Errors on the relay's own connections are told apart by SQLSTATE, so a
//! server that writes its messages in another language still has its
//! timeouts and deadlocks retried, not taken for refusals of the statement.

use std::io::Write as _;
use std::time::Duration;

use outbox_core::db::{DbError, Failure};
use tokio_postgres::{Client, NoTls};

use crate::support::TestDb;

const GERMAN: &str = "de_DE.UTF-8";

/// A connection whose server messages are German, or `None` (SKIPPED) where
/// the machine has no German locale or PostgreSQL no German messages; under
/// `CI=true` that is a failure, since `.ci/run` installs both.
async fn german(db: &TestDb) -> Option<Client> {
    let (client, connection) = tokio_postgres::connect(&db.url, NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let refused = client
        .batch_execute(&format!("SET lc_messages = '{GERMAN}'"))
        .await
        .err();
    // A message PostgreSQL translates: unchanged means no German catalogue.
    let translated = match &refused {
        None => {
            let probe = client
                .batch_execute("SELECT 1/0")
                .await
                .expect_err("division by zero");
            let message = probe.as_db_error().map(|e| e.message().to_owned());
            !message.is_some_and(|m| m.contains("division by zero"))
        }
        Some(_) => false,
    };
    if translated {
        return Some(client);
    }
    let missing = format!(
        "the locale {GERMAN} or PostgreSQL's German messages are missing \
         (Debian: localedef -i de_DE -f UTF-8 {GERMAN}){}",
        refused
            .map(|e| format!(": {}", DbError::Server(e)))
            .unwrap_or_default()
    );
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{missing}: with CI=true the localized-server test must run"
    );
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: the localized-server test did not run: {missing}"
    );
    None
}

#[tokio::test]
async fn a_statement_timeout_and_a_deadlock_are_transient_on_a_german_server() {
    let db = TestDb::new();
    let Some(first) = german(&db).await else {
        return;
    };
    let Some(second) = german(&db).await else {
        return;
    };

    first
        .batch_execute("SET statement_timeout = 50")
        .await
        .expect("set");
    let timeout = DbError::Server(
        first
            .batch_execute("SELECT pg_sleep(5)")
            .await
            .expect_err("the statement times out"),
    );
    let text = timeout.to_string();
    assert!(
        !text.contains("statement timeout"),
        "the server's message is German: {text}"
    );
    assert_eq!(timeout.failure(), Failure::Transient, "{text}");
    assert!(timeout.is_statement_timeout(), "{text}");
    first
        .batch_execute("SET statement_timeout = 0")
        .await
        .expect("reset");

    // Each holds one lock and asks for the other's: the server ends one.
    for (client, key) in [(&first, 1), (&second, 2)] {
        client
            .batch_execute(&format!("BEGIN; SELECT pg_advisory_xact_lock({key})"))
            .await
            .expect("lock");
    }
    let (a, b) = tokio::join!(
        first.batch_execute("SELECT pg_advisory_xact_lock(2)"),
        async {
            // Second in line, so that the first is already waiting.
            tokio::time::sleep(Duration::from_millis(100)).await;
            second
                .batch_execute("SELECT pg_advisory_xact_lock(1)")
                .await
        },
    );
    let mut errors: Vec<DbError> = [a, b]
        .into_iter()
        .filter_map(Result::err)
        .map(DbError::Server)
        .collect();
    assert_eq!(errors.len(), 1, "one of the two is the deadlock's victim");
    let deadlock = errors.remove(0);
    let text = deadlock.to_string();
    assert!(text.contains("40P01"), "{text}");
    assert!(
        !text.contains("deadlock detected"),
        "the server's message is German: {text}"
    );
    assert_eq!(deadlock.failure(), Failure::Transient, "{text}");
}
