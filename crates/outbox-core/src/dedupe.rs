//! The inbox: receiving a message once.
//!
//! The outbox's twin. A sender that retries (a partner's HTTP callbacks,
//! a broker's redeliveries) hands the same message over more than once, in
//! any order, sometimes to two receivers at once. [`record_message`] stores
//! its `(source, message_id)` inside the caller's Diesel transaction and says
//! whether this is the first time: apply the message in that same
//! transaction, and skip it on a [`Received::Repeat`]. The record and the
//! effect then commit together, so a crash between them is impossible, and
//! a copy that arrives while the first is still being applied waits for it
//! and then sees a repeat: no error, no second effect.
//!
//! ```no_run
//! # fn demo(conn: &mut diesel::PgConnection) -> diesel::QueryResult<()> {
//! use diesel::Connection as _;
//! use outbox_core::dedupe::{Received, record_message};
//!
//! conn.transaction(|conn| {
//!     match record_message(conn, "billing", "evt_1NG8Du2eZvKYlo2C")? {
//!         Received::First { .. } => { /* apply it: your writes, your enqueues */ }
//!         Received::Repeat => { /* applied before: change nothing */ }
//!     }
//!     Ok(())
//! })
//! # }
//! ```
//!
//! The table (`inbox_messages`, from this crate's migrations) holds only what
//! the inbox needs; an application may add columns of its own and fill them
//! in the same transaction, by the returned id. Ids are kept until
//! [`prune_messages`] removes them: keep them longer than the sender retries
//! (Stripe retries for 3 days and resends by hand for 30), or a late retry
//! is applied a second time.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text, Timestamptz};

/// What [`record_message`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// Recorded now: apply the message in this transaction. `id` is the new
    /// row of `inbox_messages`.
    First {
        /// `inbox_messages.id`.
        id: i64,
    },
    /// Already recorded by a committed transaction: change nothing.
    Repeat,
}

#[derive(QueryableByName)]
struct Inserted {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// Records message `message_id` of `source` in the caller's transaction, or
/// reports it a [`Received::Repeat`]. Call it inside a transaction that also
/// applies the message: outside one, the record commits on its own and a
/// crash before the effect loses the message.
///
/// A concurrent transaction recording the same message makes this call wait
/// until that one ends (its entry in the unique index), then answer
/// `Repeat` if it committed, or record the message if it rolled back.
pub fn record_message(
    conn: &mut PgConnection,
    source: &str,
    message_id: &str,
) -> QueryResult<Received> {
    let rows: Vec<Inserted> = diesel::sql_query(RECORD_MESSAGE_SQL)
        .bind::<Text, _>(source)
        .bind::<Text, _>(message_id)
        .load(conn)?;
    Ok(match rows.first() {
        Some(row) => Received::First { id: row.id },
        None => Received::Repeat,
    })
}

/// The dedupe's statement (`inbox/sql/record_message.sql`): `$1` source, `$2`
/// message id; returns the new row's `id`, or no row for a repeat. For a test
/// that runs it on a connection of its own, as [`record_message`] does.
pub const RECORD_MESSAGE_SQL: &str = include_str!("dedupe/sql/record_message.sql");

/// Deletes the messages received more than `older_than` ago, `batch` rows a
/// statement; returns how many went. A message id pruned is forgotten: a
/// copy received afterwards is new again.
pub fn prune_messages(
    conn: &mut PgConnection,
    older_than: Duration,
    batch: i64,
) -> QueryResult<u64> {
    prune_messages_before(conn, cutoff(Utc::now(), older_than), batch)
}

/// [`prune_messages`] with the cutoff given: messages received before `before` go.
pub fn prune_messages_before(
    conn: &mut PgConnection,
    before: DateTime<Utc>,
    batch: i64,
) -> QueryResult<u64> {
    let batch = batch.max(1);
    let mut total = 0u64;
    loop {
        let deleted = diesel::sql_query(include_str!("dedupe/sql/prune_messages.sql"))
            .bind::<Timestamptz, _>(before)
            .bind::<BigInt, _>(batch)
            .execute(conn)?;
        total += deleted as u64;
        if (deleted as i64) < batch {
            return Ok(total);
        }
    }
}

fn cutoff(now: DateTime<Utc>, older_than: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(older_than)
        .ok()
        .and_then(|age| now.checked_sub_signed(age))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retention_longer_than_time_itself_prunes_nothing() {
        let now = Utc::now();
        assert_eq!(cutoff(now, Duration::MAX), DateTime::<Utc>::MIN_UTC);
        assert_eq!(
            cutoff(now, Duration::from_secs(60)),
            now - chrono::Duration::seconds(60)
        );
    }
}
