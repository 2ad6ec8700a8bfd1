//! The inbox: a message recorded in the transaction that applies it is
//! applied once, however many copies arrive, and however they race.

use std::sync::mpsc;
use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use outbox_core::dedupe::{Claim, Received, claim_message, prune_messages, record_message};

use crate::support::TestDb;

/// The "effect" of a message in these tests: a row of a table of the test's
/// own, written in the same transaction as the inbox record.
fn create_effects(conn: &mut PgConnection) {
    diesel::sql_query("CREATE TABLE effects (message_id text NOT NULL)")
        .execute(conn)
        .expect("create effects");
}

fn receive(conn: &mut PgConnection, source: &str, message_id: &str) -> Received {
    conn.transaction(|conn| {
        let received = record_message(conn, source, message_id)?;
        if let Received::First { .. } = received {
            diesel::sql_query("INSERT INTO effects VALUES ($1)")
                .bind::<Text, _>(message_id)
                .execute(conn)?;
        }
        QueryResult::Ok(received)
    })
    .expect("receive")
}

fn effects_of(conn: &mut PgConnection, message_id: &str) -> i64 {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    diesel::sql_query("SELECT count(*) AS n FROM effects WHERE message_id = $1")
        .bind::<Text, _>(message_id)
        .get_result::<Count>(conn)
        .expect("count effects")
        .n
}

#[test]
fn a_repeated_message_is_reported_and_applied_once() {
    let db = TestDb::new();
    let mut conn = db.conn();
    create_effects(&mut conn);

    assert!(matches!(
        receive(&mut conn, "billing", "evt_1"),
        Received::First { .. }
    ));
    assert_eq!(receive(&mut conn, "billing", "evt_1"), Received::Repeat);
    // Another source's message of the same id is its own.
    assert!(matches!(
        receive(&mut conn, "shipping", "evt_1"),
        Received::First { .. }
    ));
    assert_eq!(effects_of(&mut conn, "evt_1"), 2);
}

#[test]
fn a_message_whose_transaction_rolled_back_is_new_again() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let failed: QueryResult<()> = conn.transaction(|conn| {
        record_message(conn, "billing", "evt_2")?;
        Err(diesel::result::Error::RollbackTransaction)
    });
    assert!(failed.is_err());
    let again = conn
        .transaction(|conn| record_message(conn, "billing", "evt_2"))
        .expect("record");
    assert!(matches!(again, Received::First { .. }));
}

/// Two receivers on two connections take the same message at once: the
/// second waits for the first's transaction and then sees a repeat, with no
/// error and no second effect; had the first rolled back, the second applies it.
#[test]
fn a_concurrent_copy_waits_for_the_first_and_is_a_repeat_or_takes_over_after_a_rollback() {
    for first_commits in [true, false] {
        let db = TestDb::new();
        create_effects(&mut db.conn());
        let (recorded_tx, recorded_rx) = mpsc::channel::<()>();
        let (finish_tx, finish_rx) = mpsc::channel::<()>();
        let url = db.url.clone();
        let first = std::thread::spawn(move || {
            let mut conn = PgConnection::establish(&url).expect("connect");
            let result: QueryResult<Received> = conn.transaction(|conn| {
                let received = record_message(conn, "billing", "evt_3")?;
                diesel::sql_query("INSERT INTO effects VALUES ('evt_3')").execute(conn)?;
                recorded_tx.send(()).expect("signal");
                finish_rx.recv().expect("go on");
                if first_commits {
                    Ok(received)
                } else {
                    Err(diesel::result::Error::RollbackTransaction)
                }
            });
            result
        });
        recorded_rx.recv().expect("the first copy is recorded");

        let url = db.url.clone();
        let (second_tx, second_rx) = mpsc::channel();
        let second_thread = std::thread::spawn(move || {
            let mut conn = PgConnection::establish(&url).expect("connect");
            second_tx
                .send(receive(&mut conn, "billing", "evt_3"))
                .expect("send");
        });
        // The second copy blocks on the first's unique-index entry.
        assert!(
            second_rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "the second copy must wait for the first transaction"
        );
        finish_tx.send(()).expect("finish the first");
        let first = first.join().expect("first thread");
        let second = second_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the second copy is answered once the first ends");
        second_thread.join().expect("second thread");

        let mut conn = db.conn();
        if first_commits {
            assert!(matches!(first, Ok(Received::First { .. })));
            assert_eq!(second, Received::Repeat);
        } else {
            assert!(first.is_err());
            assert!(matches!(second, Received::First { .. }));
        }
        assert_eq!(effects_of(&mut conn, "evt_3"), 1);
    }
}

#[test]
fn pruning_forgets_only_the_messages_older_than_the_retention() {
    let db = TestDb::new();
    let mut conn = db.conn();
    for id in ["old", "recent"] {
        conn.transaction(|conn| record_message(conn, "billing", id))
            .expect("record");
    }
    diesel::sql_query(
        "UPDATE inbox_messages SET received_at = now() - interval '35 days 1 minute' \
         WHERE message_id = 'old'",
    )
    .execute(&mut conn)
    .expect("age");
    diesel::sql_query(
        "UPDATE inbox_messages SET received_at = now() - interval '34 days 23 hours' \
         WHERE message_id = 'recent'",
    )
    .execute(&mut conn)
    .expect("age");

    let pruned = prune_messages(&mut conn, Duration::from_secs(35 * 86_400), 1).expect("prune");
    assert_eq!(pruned, 1);
    let repeat = conn
        .transaction(|conn| record_message(conn, "billing", "recent"))
        .expect("record");
    assert_eq!(repeat, Received::Repeat);
    let forgotten = conn
        .transaction(|conn| record_message(conn, "billing", "old"))
        .expect("record");
    assert!(matches!(forgotten, Received::First { .. }));
}

/// A claimed message, applied as an application with columns of its own
/// does: the effect, then the row, written once with the claim's id.
fn receive_claimed(conn: &mut PgConnection, message_id: &str) -> QueryResult<Claim> {
    conn.transaction(|conn| {
        let claim = claim_message(conn, "billing", message_id)?;
        if let Claim::New { id } = claim {
            insert_claimed(conn, id, message_id)?;
        }
        Ok(claim)
    })
}

fn insert_claimed(conn: &mut PgConnection, id: i64, message_id: &str) -> QueryResult<()> {
    diesel::sql_query("INSERT INTO effects VALUES ($1)")
        .bind::<Text, _>(message_id)
        .execute(conn)?;
    diesel::sql_query(
        "INSERT INTO inbox_messages (id, source, message_id) VALUES ($1, 'billing', $2)",
    )
    .bind::<BigInt, _>(id)
    .bind::<Text, _>(message_id)
    .execute(conn)?;
    Ok(())
}

#[test]
fn a_claimed_message_is_new_once_then_a_repeat_of_its_row() {
    let db = TestDb::new();
    let mut conn = db.conn();
    create_effects(&mut conn);
    let Ok(Claim::New { id }) = receive_claimed(&mut conn, "evt_4") else {
        panic!("the first copy is new");
    };
    assert_eq!(
        receive_claimed(&mut conn, "evt_4").expect("claim"),
        Claim::Repeat { id }
    );
    // A claim whose transaction rolled back leaves nothing behind.
    let failed: QueryResult<()> = conn.transaction(|conn| {
        claim_message(conn, "billing", "evt_5")?;
        Err(diesel::result::Error::RollbackTransaction)
    });
    assert!(failed.is_err());
    assert!(matches!(
        receive_claimed(&mut conn, "evt_5"),
        Ok(Claim::New { .. })
    ));
    // A row recorded without a claim is a repeat to a claim.
    conn.transaction(|conn| record_message(conn, "billing", "evt_6"))
        .expect("record");
    assert!(matches!(
        receive_claimed(&mut conn, "evt_6"),
        Ok(Claim::Repeat { .. })
    ));
    assert_eq!(effects_of(&mut conn, "evt_4"), 1);
    assert_eq!(effects_of(&mut conn, "evt_5"), 1);
}

/// Two receivers claim one message at once: the second waits for the
/// first's whole transaction (effect and row), then sees a repeat; had the
/// first rolled back, the second applies it. No error either way.
#[test]
fn a_concurrent_claim_waits_for_the_first_and_is_a_repeat_or_takes_over_after_a_rollback() {
    for first_commits in [true, false] {
        let db = TestDb::new();
        create_effects(&mut db.conn());
        let (claimed_tx, claimed_rx) = mpsc::channel::<()>();
        let (finish_tx, finish_rx) = mpsc::channel::<()>();
        let url = db.url.clone();
        let first = std::thread::spawn(move || {
            let mut conn = PgConnection::establish(&url).expect("connect");
            let result: QueryResult<Claim> = conn.transaction(|conn| {
                let claim = claim_message(conn, "billing", "evt_7")?;
                claimed_tx.send(()).expect("signal");
                finish_rx.recv().expect("go on");
                if let Claim::New { id } = claim {
                    insert_claimed(conn, id, "evt_7")?;
                }
                if first_commits {
                    Ok(claim)
                } else {
                    Err(diesel::result::Error::RollbackTransaction)
                }
            });
            result
        });
        claimed_rx.recv().expect("the first copy is claimed");

        let url = db.url.clone();
        let (second_tx, second_rx) = mpsc::channel();
        let second_thread = std::thread::spawn(move || {
            let mut conn = PgConnection::establish(&url).expect("connect");
            second_tx
                .send(receive_claimed(&mut conn, "evt_7"))
                .expect("send");
        });
        // The second copy waits for the first's turn, though no row exists yet.
        assert!(
            second_rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "the second copy must wait for the first transaction"
        );
        finish_tx.send(()).expect("finish the first");
        let first = first.join().expect("first thread");
        let second = second_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the second copy is answered once the first ends")
            .expect("no error for the second copy");
        second_thread.join().expect("second thread");

        let mut conn = db.conn();
        if first_commits {
            let Ok(Claim::New { id }) = first else {
                panic!("the first copy is new: {first:?}");
            };
            assert_eq!(second, Claim::Repeat { id });
        } else {
            assert!(first.is_err());
            assert!(matches!(second, Claim::New { .. }));
        }
        assert_eq!(effects_of(&mut conn, "evt_7"), 1);
    }
}
